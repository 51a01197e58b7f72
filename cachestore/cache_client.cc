#include "cachestore/cache_client.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {

absl::StatusOr<Hash128> NamespaceOf(const ClientNamespace& ns) {
  RETURN_IF_ERROR(CheckModelCost(ns.model_cost));
  return ValidatedNamespaceKey(ns.model_fingerprint, ns.adapter, ns.tenant, ns.cache_salt, ns.page_size);
}

Hash128 ChainKeyOf(const ClientNamespace& ns, absl::Span<const TokenId> tokens) {
  const Hash128 root = ns.Key();
  if (ns.page_size <= 0 || tokens.size() < static_cast<size_t>(ns.page_size)) return root;
  return PageKey(root, tokens.first(static_cast<size_t>(ns.page_size)));
}

absl::StatusOr<std::string> CacheClient::Get(uint64_t lease_id, const Hash128& key) {
  std::string out;
  absl::Status s = GetInto(lease_id, key, &out);
  if (!s.ok()) return s;
  return out;
}

std::vector<absl::StatusOr<PutResult>> CacheClient::PutMany(const ClientNamespace& ns,
                                                            absl::Span<const PutManyEntry> entries) {
  std::vector<absl::StatusOr<PutResult>> results;
  results.reserve(entries.size());
  for (const PutManyEntry& e : entries) {
    if (e.checksum.has_value() && common::Checksum64(e.bytes.data(), e.bytes.size()) != *e.checksum) {
      results.push_back(absl::DataLossError("checksum mismatch: the bytes do not hash to the entry's checksum"));
      continue;
    }
    results.push_back(Put(ns, *e.put, e.bytes));
    const absl::StatusCode code = results.back().status().code();
    if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
        code == absl::StatusCode::kCancelled) {
      // The cache is unreachable or hung: as a stream would, the call ends
      // here, without a call (or a timeout) per entry left.
      results.resize(entries.size(), results.back().status());
      break;
    }
  }
  return results;
}

absl::Status CacheClient::GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out) {
  if (keys.empty() || keys.size() != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetManyInto: ", keys.size(), " keys into ", out.size(), " outputs (at least one, as many)"));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::Status s = GetInto(lease_id, keys[i], &out[i]);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("keys[", i, "]: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckEntryFits(size_t index, size_t entry_bytes, const EntrySegments& destination) {
  if (entry_bytes == destination.bytes()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("keys[", index, "]: the entry has ", entry_bytes, " bytes, its destination ", destination.bytes()));
}

absl::Status CacheClient::GetManyScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                           absl::Span<const EntrySegments> out) {
  if (keys.empty() || keys.size() != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat("GetManyScattered: ", keys.size(), " keys into ", out.size(),
                                                   " destinations (at least one, as many)"));
  }
  std::vector<std::string> bytes(keys.size());
  RETURN_IF_ERROR(GetManyInto(lease_id, keys, absl::MakeSpan(bytes)));
  for (size_t i = 0; i < keys.size(); ++i) {
    RETURN_IF_ERROR(CheckEntryFits(i, bytes[i].size(), out[i]));
    size_t at = 0;
    for (const absl::Span<char>& segment : out[i].segments) {
      if (!segment.empty()) std::memcpy(segment.data(), bytes[i].data() + at, segment.size());
      at += segment.size();
    }
  }
  return absl::OkStatus();
}

}  // namespace hybridserve::cachestore
