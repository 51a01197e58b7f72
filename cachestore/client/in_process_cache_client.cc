#include "cachestore/client/in_process_cache_client.h"

#include <memory>
#include <string>
#include <utility>

#include "common/hash.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {

InProcessCacheClient::InProcessCacheClient(CacheStore& store) : store_(store) {}

absl::StatusOr<LookupResult> InProcessCacheClient::Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                                          LookupMode mode) {
  ASSIGN_OR_RETURN(const Hash128 key, NamespaceOf(ns));
  return store_.Lookup(key, ns.page_size, tokens, mode == LookupMode::kLease);
}

absl::StatusOr<PutResult> InProcessCacheClient::Put(const ClientNamespace& ns, const ClientPut& put,
                                                    absl::string_view bytes) {
  return PutChecked(ns, put, bytes, common::Checksum64(bytes.data(), bytes.size()));
}

std::vector<absl::StatusOr<PutResult>> InProcessCacheClient::PutMany(const ClientNamespace& ns,
                                                                     absl::Span<const PutManyEntry> entries) {
  std::vector<absl::StatusOr<PutResult>> results;
  results.reserve(entries.size());
  for (const PutManyEntry& e : entries) {
    results.push_back(
        PutChecked(ns, *e.put, e.bytes, e.checksum.value_or(common::Checksum64(e.bytes.data(), e.bytes.size()))));
  }
  return results;
}

absl::StatusOr<PutResult> InProcessCacheClient::PutChecked(const ClientNamespace& ns, const ClientPut& put,
                                                           absl::string_view bytes, uint64_t checksum) {
  // The PutSpec the service builds from the same request (service.cc SpecOf).
  PutSpec spec;
  ASSIGN_OR_RETURN(spec.ns, NamespaceOf(ns));
  spec.tenant = ns.tenant;
  spec.model_cost = ns.model_cost;
  spec.page_size = ns.page_size;
  spec.entry_class = put.entry_class;
  spec.parent = put.parent;
  spec.tokens = put.tokens;
  if (put.entry_class == EntryClass::kState) {
    spec.state_kind = put.state_kind;
    spec.position = put.position;
  }
  spec.ttl = put.ttl;  // states only: the index refuses it on a page
  spec.pin = put.pin;
  spec.size_bytes = static_cast<int64_t>(bytes.size());
  ASSIGN_OR_RETURN(std::unique_ptr<PutSession> session, store_.BeginPut(spec));
  PutResult result;
  result.key = session->key();
  result.ttl = session->reservation().ttl;
  result.pinned = session->reservation().pinned;
  result.pin_refused = session->reservation().pin_refused;
  if (session->already_present()) {
    result.already_present = true;
    return result;
  }
  RETURN_IF_ERROR(session->Write(0, bytes));
  RETURN_IF_ERROR(session->Commit(checksum));
  return result;
}

absl::Status InProcessCacheClient::GetInto(uint64_t lease_id, const Hash128& key, std::string* out) {
  out->clear();
  ASSIGN_OR_RETURN(ReadHandle handle, store_.OpenVerified(lease_id, key));
  out->assign(reinterpret_cast<const char*>(handle.blob->data.get()), handle.blob->size);
  return absl::OkStatus();
}

absl::Status InProcessCacheClient::Release(uint64_t lease_id) { return store_.Release(lease_id); }

absl::StatusOr<IndexStats> InProcessCacheClient::Stats() { return store_.Stats(); }

}  // namespace hybridserve::cachestore
