#include "cachestore/client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/hash.h"
#include "grpcpp/grpcpp.h"
#include "proto/cachestore.grpc.pb.h"

namespace hybridserve::cachestore {
namespace {

using common::FromGrpcStatus;

v1::CacheNamespace ToProto(const ClientNamespace& ns) {
  v1::CacheNamespace out;
  out.set_model_fingerprint(ns.model_fingerprint);
  out.set_adapter(ns.adapter);
  out.set_cache_salt(ns.cache_salt);
  out.set_page_size(static_cast<uint32_t>(ns.page_size));
  out.set_key_version(kKeyVersion);  // the derivation of the parent keys this client sends
  return out;
}

absl::StatusOr<EntryInfo> FromProto(const v1::EntryRef& e) {
  EntryInfo info;
  if (!Hash128::FromBytes(e.key(), &info.key)) return absl::InternalError("cachestore sent a malformed key");
  info.entry_class = e.entry_class() == v1::ENTRY_CLASS_STATE ? EntryClass::kState : EntryClass::kPage;
  info.size_bytes = static_cast<int64_t>(e.size_bytes());
  info.checksum = e.checksum();
  info.state_kind =
      e.state_kind() == v1::STATE_KIND_GRID_CHECKPOINT ? StateKind::kGridCheckpoint : StateKind::kExactPrefix;
  info.position = static_cast<int64_t>(e.position());
  return info;
}

void FromProto(const v1::ClassStats& s, ClassStats* out) {
  out->entries = static_cast<int64_t>(s.entries());
  out->resident_bytes = static_cast<int64_t>(s.resident_bytes());
  out->reserved_bytes = static_cast<int64_t>(s.reserved_bytes());
  out->budget_bytes = static_cast<int64_t>(s.budget_bytes());
  out->evicted_lru = static_cast<int64_t>(s.evicted_lru());
  out->evicted_ttl = static_cast<int64_t>(s.evicted_ttl());
  out->dropped_with_pages = static_cast<int64_t>(s.dropped_with_pages());
}

}  // namespace

struct CacheStoreClient::Impl {
  ClientOptions options;
  std::unique_ptr<v1::CacheStore::Stub> stub;

  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options.timeout));
  }
};

absl::StatusOr<std::unique_ptr<CacheStoreClient>> CacheStoreClient::Create(const std::string& target,
                                                                           const ClientOptions& options) {
  if (options.chunk_bytes <= 0 || options.chunk_bytes > (int64_t{64} << 20)) {
    return absl::InvalidArgumentError("chunk_bytes must be in (0, 64 MiB]");
  }
  grpc::ChannelArguments args;
  const int max_message = static_cast<int>(options.chunk_bytes + (1 << 20));
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->stub = v1::CacheStore::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  return std::unique_ptr<CacheStoreClient>(new CacheStoreClient(std::move(impl)));
}

CacheStoreClient::CacheStoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CacheStoreClient::~CacheStoreClient() = default;

absl::StatusOr<LookupResult> CacheStoreClient::Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                                      LookupMode mode) {
  v1::LookupRequest req;
  *req.mutable_namespace_() = ToProto(ns);
  req.mutable_token_ids()->Add(tokens.begin(), tokens.end());
  req.set_probe_only(mode == LookupMode::kProbeOnly);
  // The answer's size stays independent of the chain's length: the page keys
  // are derived here from the tokens, as the server derived them.
  req.set_omit_pages(true);
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  // Before the request leaves: the server's lease starts no earlier.
  const absl::Time sent = absl::Now();
  absl::Status s = FromGrpcStatus(impl_->stub->Lookup(&ctx, req, &resp));
  if (!s.ok()) return s;
  LookupResult r;
  r.resume_position = static_cast<int64_t>(resp.resume_position());
  r.kv_match_tokens = static_cast<int64_t>(resp.kv_match_tokens());
  const uint64_t page_count = resp.page_count();
  if (ns.page_size <= 0 || resp.resume_position() > tokens.size() ||
      page_count != resp.resume_position() / static_cast<uint64_t>(ns.page_size)) {
    return absl::InternalError(absl::StrCat("cachestore answered resume_position ", resp.resume_position(), " with ",
                                            page_count, " pages for ", tokens.size(), " tokens"));
  }
  if (page_count > 0) {
    std::vector<Hash128> keys = PageKeys(ns.Key(), tokens.subspan(0, page_count * ns.page_size), ns.page_size);
    r.pages.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      EntryInfo info;  // size and checksum arrive with the bytes
      info.key = keys[i];
      info.entry_class = EntryClass::kPage;
      info.position = static_cast<int64_t>((i + 1) * ns.page_size);
      r.pages.push_back(info);
    }
  }
  if (resp.has_state()) {
    absl::StatusOr<EntryInfo> info = FromProto(resp.state());
    if (!info.ok()) return info.status();
    r.state = *info;
  }
  r.lease_id = resp.lease_id();
  if (r.lease_id != 0) {
    r.lease_expiry = sent + absl::Seconds(resp.lease_ttl().seconds()) + absl::Nanoseconds(resp.lease_ttl().nanos());
  }
  return r;
}

absl::StatusOr<PutResult> CacheStoreClient::Put(const ClientNamespace& ns, const ClientPut& put,
                                                absl::string_view bytes) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  v1::PutResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::PutRequest>> writer = impl_->stub->Put(&ctx, &resp);
  v1::PutRequest msg;
  v1::PutHeader* h = msg.mutable_header();
  *h->mutable_namespace_() = ToProto(ns);
  h->set_entry_class(put.entry_class == EntryClass::kPage ? v1::ENTRY_CLASS_PAGE : v1::ENTRY_CLASS_STATE);
  if (put.parent.has_value()) h->set_parent_key(put.parent->ToBytes());
  h->mutable_token_ids()->Add(put.tokens.begin(), put.tokens.end());
  if (put.entry_class == EntryClass::kState) {
    h->set_state_kind(put.state_kind == StateKind::kGridCheckpoint ? v1::STATE_KIND_GRID_CHECKPOINT
                                                                   : v1::STATE_KIND_EXACT_PREFIX);
    h->set_position(static_cast<uint64_t>(put.position));
  }
  // States only: the server refuses retention on a page.
  if (put.ttl != absl::ZeroDuration()) {
    const int64_t nanos = absl::ToInt64Nanoseconds(put.ttl);
    h->mutable_ttl()->set_seconds(nanos / 1000000000);
    h->mutable_ttl()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
  }
  h->set_pin(put.pin);
  h->set_size_bytes(bytes.size());
  // A failed Write means the server already answered (e.g. already present,
  // or an error); Finish tells which.
  bool open = writer->Write(msg);
  const int64_t chunk = impl_->options.chunk_bytes;
  for (size_t off = 0; open && off < bytes.size(); off += chunk) {
    msg.Clear();
    msg.mutable_chunk()->set_offset(off);
    msg.mutable_chunk()->set_data(bytes.data() + off, std::min<size_t>(chunk, bytes.size() - off));
    open = writer->Write(msg);
  }
  if (open) {
    msg.Clear();
    msg.mutable_commit()->set_checksum(common::Checksum64(bytes.data(), bytes.size()));
    writer->Write(msg);
  }
  writer->WritesDone();
  absl::Status s = FromGrpcStatus(writer->Finish());
  if (!s.ok()) return s;
  PutResult r;
  if (!Hash128::FromBytes(resp.key(), &r.key)) return absl::InternalError("cachestore sent a malformed key");
  r.already_present = resp.already_present();
  if (resp.has_ttl()) r.ttl = absl::Seconds(resp.ttl().seconds()) + absl::Nanoseconds(resp.ttl().nanos());
  r.pinned = resp.pinned();
  r.pin_refused = resp.pin_refused_reason();
  return r;
}

absl::Status CacheStoreClient::GetInto(uint64_t lease_id, const Hash128& key, std::string* out) {
  v1::GetRequest req;
  req.set_lease_id(lease_id);
  req.set_key(key.ToBytes());
  req.set_chunk_bytes(static_cast<uint32_t>(impl_->options.chunk_bytes));
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  std::unique_ptr<grpc::ClientReader<v1::GetResponse>> reader = impl_->stub->Get(&ctx, req);
  v1::GetResponse msg;
  out->clear();
  uint64_t size = 0, checksum = 0;
  bool first = true;
  while (reader->Read(&msg)) {
    if (first) {
      size = msg.size_bytes();
      checksum = msg.checksum();
      if (size > (uint64_t{1} << 40)) {
        ctx.TryCancel();
        reader->Finish();
        return absl::DataLossError("cachestore announced an implausible entry size");
      }
      out->reserve(size);
      first = false;
    }
    if (msg.offset() != out->size() || out->size() + msg.data().size() > size) {
      ctx.TryCancel();
      reader->Finish();
      return absl::DataLossError("cachestore sent chunks out of order or past the size");
    }
    out->append(msg.data());
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (!s.ok()) return s;
  if (out->size() != size || common::Checksum64(out->data(), out->size()) != checksum) {
    return absl::DataLossError(absl::StrCat("entry ", key.ToHex(), " arrived incomplete or corrupted"));
  }
  return absl::OkStatus();
}

absl::Status CacheStoreClient::GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys,
                                           absl::Span<std::string> out) {
  if (keys.empty() || keys.size() != out.size()) return CacheClient::GetManyInto(lease_id, keys, out);
  v1::GetManyRequest req;
  req.set_lease_id(lease_id);
  for (const Hash128& key : keys) req.add_keys(key.ToBytes());
  req.set_chunk_bytes(static_cast<uint32_t>(impl_->options.chunk_bytes));
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  std::unique_ptr<grpc::ClientReader<v1::GetManyResponse>> reader = impl_->stub->GetMany(&ctx, req);
  auto fail = [&](absl::Status s) {
    ctx.TryCancel();
    reader->Finish();
    return s;
  };
  // The entry being received: index `current`, `size` bytes, `checksum`.
  int64_t current = -1;
  uint64_t size = 0, checksum = 0;
  auto finish_entry = [&]() -> absl::Status {
    const std::string& got = out[static_cast<size_t>(current)];
    if (got.size() != size || common::Checksum64(got.data(), got.size()) != checksum) {
      return absl::DataLossError(absl::StrCat("keys[", current, "] (", keys[static_cast<size_t>(current)].ToHex(),
                                              ") arrived incomplete or corrupted"));
    }
    return absl::OkStatus();
  };
  v1::GetManyResponse msg;
  while (reader->Read(&msg)) {
    if (static_cast<int64_t>(msg.index()) != current) {
      // A new entry: the next index, starting at offset 0 with its size.
      if (current >= 0) {
        if (absl::Status s = finish_entry(); !s.ok()) return fail(s);
      }
      if (static_cast<int64_t>(msg.index()) != current + 1 || msg.offset() != 0) {
        return fail(absl::DataLossError("cachestore sent GetMany entries out of order"));
      }
      current = msg.index();
      size = msg.size_bytes();
      checksum = msg.checksum();
      if (size > (uint64_t{1} << 40))
        return fail(absl::DataLossError("cachestore announced an implausible entry size"));
      out[static_cast<size_t>(current)].clear();
      out[static_cast<size_t>(current)].reserve(size);
    }
    std::string& dest = out[static_cast<size_t>(current)];
    if (msg.offset() != dest.size() || dest.size() + msg.data().size() > size) {
      return fail(absl::DataLossError("cachestore sent chunks out of order or past the size"));
    }
    dest.append(msg.data());
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (!s.ok()) return s;
  if (current != static_cast<int64_t>(keys.size()) - 1) {
    return absl::DataLossError(absl::StrCat("GetMany ended after ", current + 1, " of ", keys.size(), " entries"));
  }
  return finish_entry();
}

absl::Status CacheStoreClient::Release(uint64_t lease_id) {
  v1::ReleaseRequest req;
  req.set_lease_id(lease_id);
  v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  return FromGrpcStatus(impl_->stub->Release(&ctx, req, &resp));
}

absl::StatusOr<IndexStats> CacheStoreClient::Stats() {
  v1::StatsRequest req;
  v1::StatsResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  absl::Status s = FromGrpcStatus(impl_->stub->Stats(&ctx, req, &resp));
  if (!s.ok()) return s;
  IndexStats out;
  FromProto(resp.pages(), &out.pages);
  FromProto(resp.states(), &out.states);
  out.namespaces = static_cast<int64_t>(resp.namespaces());
  out.active_leases = static_cast<int64_t>(resp.active_leases());
  out.active_puts = static_cast<int64_t>(resp.active_puts());
  out.lookups = static_cast<int64_t>(resp.lookups());
  out.lookup_hits = static_cast<int64_t>(resp.lookup_hits());
  out.hits_grid_checkpoint = static_cast<int64_t>(resp.hits_grid_checkpoint());
  out.hits_exact_prefix = static_cast<int64_t>(resp.hits_exact_prefix());
  out.checksum_failures = static_cast<int64_t>(resp.checksum_failures());
  out.expired_leases = static_cast<int64_t>(resp.expired_leases());
  out.expired_puts = static_cast<int64_t>(resp.expired_puts());
  out.pinned_states = static_cast<int64_t>(resp.pinned_states());
  out.pinned_bytes = static_cast<int64_t>(resp.pinned_bytes());
  return out;
}

}  // namespace hybridserve::cachestore
