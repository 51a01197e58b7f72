#include "cachestore/server/service.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachestore/server/put_header.h"
#include "cachestore/wire/entry_messages.h"
#include "common/grpc_status.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "common/tokens.h"

namespace hybridserve::cachestore {
namespace {

using common::ToGrpcStatus;

absl::StatusOr<Hash128> KeyOf(const std::string& bytes, absl::string_view what) {
  Hash128 key;
  if (!Hash128::FromBytes(bytes, &key)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be 16 bytes, got ", bytes.size()));
  }
  return key;
}

// The one chunking rule of Get and GetMany: the message carrying the chunk
// of entry `h` at `offset` (at most `chunk` bytes), the first chunk also
// carrying the entry's size and checksum, and GetMany's messages their
// entry's index. The chunk's slice points into the entry and holds it.
template <typename Response>
grpc::ByteBuffer ChunkMessage(const ReadHandle& h, int64_t offset, int64_t chunk, uint32_t index) {
  const int64_t size = static_cast<int64_t>(h.blob->size);
  const uint64_t first_size = offset == 0 ? static_cast<uint64_t>(size) : 0;
  const uint64_t first_checksum = offset == 0 ? h.info.checksum : 0;
  const grpc::Slice data = entry_messages::BorrowedSlice(h.blob->data.get() + offset,
                                                         static_cast<size_t>(std::min(chunk, size - offset)), h.blob);
  if constexpr (std::is_same_v<Response, v1::GetManyResponse>) {
    return entry_messages::EncodeChunk({{entry_messages::kManyIndex, index},
                                        {entry_messages::kManySizeBytes, first_size},
                                        {entry_messages::kManyChecksum, first_checksum},
                                        {entry_messages::kManyOffset, static_cast<uint64_t>(offset)}},
                                       entry_messages::kManyData, data);
  } else {
    return entry_messages::EncodeChunk({{entry_messages::kGetSizeBytes, first_size},
                                        {entry_messages::kGetChecksum, first_checksum},
                                        {entry_messages::kGetOffset, static_cast<uint64_t>(offset)}},
                                       entry_messages::kGetData, data);
  }
}

// A call that ends as soon as it starts (refused by admission or a malformed
// request): Finish now, delete itself when gRPC is done with it.
template <typename Reactor>
class FinishedCall final : public Reactor {
 public:
  explicit FinishedCall(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

// A unary call's reactor: holds the call's admission slot until the answer has
// been sent (or the call cancelled).
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  explicit UnaryCall(CallAdmission::Slot slot) : slot_(std::move(slot)) {}
  void OnDone() override { delete this; }

 private:
  CallAdmission::Slot slot_;
};

v1::EntryRef ToProto(const EntryInfo& e) {
  v1::EntryRef out;
  out.set_key(e.key.ToBytes());
  out.set_entry_class(e.entry_class == EntryClass::kPage ? v1::ENTRY_CLASS_PAGE : v1::ENTRY_CLASS_STATE);
  out.set_size_bytes(static_cast<uint64_t>(e.size_bytes));
  out.set_checksum(e.checksum);
  out.set_location(v1::ENTRY_LOCATION_CACHESTORE_HOST);
  if (e.entry_class == EntryClass::kState) {
    out.set_state_kind(e.state_kind == StateKind::kGridCheckpoint ? v1::STATE_KIND_GRID_CHECKPOINT
                                                                  : v1::STATE_KIND_EXACT_PREFIX);
  }
  out.set_position(static_cast<uint64_t>(e.position));
  return out;
}

void FillClass(const ClassStats& s, v1::ClassStats* out) {
  out->set_entries(s.entries);
  out->set_resident_bytes(s.resident_bytes);
  out->set_reserved_bytes(s.reserved_bytes);
  out->set_metadata_bytes(s.metadata_bytes);
  out->set_budget_bytes(s.budget_bytes);
  out->set_evicted_lru(s.evicted_lru);
  out->set_evicted_ttl(s.evicted_ttl);
  out->set_dropped_with_pages(s.dropped_with_pages);
}

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

}  // namespace

CacheStoreService::CacheStoreService(CacheStore& store, ServiceMetrics& metrics, const ServiceOptions& options)
    : store_(store),
      metrics_(metrics),
      options_(options),
      admission_(options.max_streams, options.max_streams_per_peer) {}

absl::StatusOr<CallAdmission::Slot> CacheStoreService::Admit(grpc::CallbackServerContext* context) {
  absl::StatusOr<CallAdmission::Slot> slot = admission_.Admit(context->peer());
  if (!slot.ok()) metrics_.RecordRefusedCall();
  return slot;
}

template <typename Request>
absl::StatusOr<CallAdmission::Slot> CacheStoreService::AdmitRaw(grpc::CallbackServerContext* context,
                                                                const grpc::ByteBuffer& raw, Request* request) {
  absl::StatusOr<CallAdmission::Slot> slot = Admit(context);
  if (!slot.ok()) return slot;
  if (!entry_messages::ParseMessage(raw, request)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", Request::descriptor()->name()));
  }
  return slot;
}

template <typename Answer>
grpc::ServerUnaryReactor* CacheStoreService::Unary(grpc::CallbackServerContext* context, Answer answer) {
  absl::StatusOr<CallAdmission::Slot> slot = Admit(context);
  if (!slot.ok()) {
    grpc::ServerUnaryReactor* refused = context->DefaultReactor();
    refused->Finish(ToGrpcStatus(slot.status()));
    return refused;
  }
  auto* call = new UnaryCall(*std::move(slot));
  call->Finish(answer());
  return call;
}

grpc::ServerUnaryReactor* CacheStoreService::Lookup(grpc::CallbackServerContext* context,
                                                    const v1::LookupRequest* request, v1::LookupResponse* response) {
  return Unary(context, [&] { return AnswerLookup(*request, response); });
}

grpc::ServerUnaryReactor* CacheStoreService::Release(grpc::CallbackServerContext* context,
                                                     const v1::ReleaseRequest* request, v1::ReleaseResponse*) {
  return Unary(context, [&] { return AnswerRelease(*request); });
}

grpc::ServerUnaryReactor* CacheStoreService::Stats(grpc::CallbackServerContext* context, const v1::StatsRequest*,
                                                   v1::StatsResponse* response) {
  return Unary(context, [&] { return AnswerStats(response); });
}

grpc::Status CacheStoreService::AnswerLookup(const v1::LookupRequest& request, v1::LookupResponse* response) {
  absl::StatusOr<Hash128> ns = NamespaceOf(request.namespace_());
  if (!ns.ok()) return ToGrpcStatus(ns.status());
  absl::StatusOr<LookupResult> r =
      store_.Lookup(*ns, static_cast<int32_t>(request.namespace_().page_size()),
                    absl::MakeConstSpan(request.token_ids().data(), request.token_ids_size()), !request.probe_only());
  if (!r.ok()) return ToGrpcStatus(r.status());
  metrics_.RecordLookup(*r, r->state.has_value());
  response->set_resume_position(static_cast<uint64_t>(r->resume_position));
  response->set_kv_match_tokens(static_cast<uint64_t>(r->kv_match_tokens));
  response->set_page_count(r->pages.size());
  if (!request.omit_pages()) {
    for (const EntryInfo& p : r->pages) *response->add_pages() = ToProto(p);
  }
  if (r->state.has_value()) *response->mutable_state() = ToProto(*r->state);
  response->set_pages_from_disk(static_cast<uint64_t>(r->pages_from_disk));
  response->set_state_from_disk(r->state_from_disk);
  response->set_lease_id(r->lease_id);
  if (r->lease_id != 0) {
    const absl::Duration ttl = store_.options().lease_ttl;
    const int64_t seconds = absl::ToInt64Seconds(ttl);
    response->mutable_lease_ttl()->set_seconds(seconds);
    response->mutable_lease_ttl()->set_nanos(
        static_cast<int32_t>(absl::ToInt64Nanoseconds(ttl - absl::Seconds(seconds))));
  }
  return grpc::Status::OK;
}

// One Put stream: header, chunks in order, commit. gRPC calls OnReadDone
// serially; Reclaim comes from the reaper thread. The stream is finished once
// (mu_), and the session is touched only by OnReadDone and OnDone, which never
// run at the same time.
//
// Messages arrive raw: a plain chunk (the bulk of a put) is decoded in place
// and its bytes copied from gRPC's slices straight into the entry (entry_messages.h);
// anything else (the header, the commit, an unusual encoding) is parsed by
// protobuf.
class PutReactor : public grpc::ServerReadReactor<grpc::ByteBuffer>, public ReclaimablePut {
 public:
  PutReactor(CacheStoreService& service, CallAdmission::Slot slot, grpc::ByteBuffer* response)
      : service_(service), slot_(std::move(slot)), response_(response), start_(absl::Now()) {
    StartRead(&raw_);
  }

  void OnReadDone(bool ok) override {
    grpc::Status s;
    if (!ok) {
      // Half-closed or cancelled before the commit.
      s = session_ == nullptr ? grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a put stream starts with a header")
                              : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                             absl::StrCat("put stream ended before commit: ", session_->bytes_written(),
                                                          " of ", session_->size_bytes(), " bytes arrived"));
    } else if (session_ != nullptr &&
               entry_messages::DecodeChunk(raw_, entry_messages::kChunkData, entry_messages::kPutChunk, &chunk_).ok()) {
      s = OnChunk();
    } else if (!entry_messages::ParseMessage(raw_, &msg_)) {
      s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed put message");
    } else {
      s = session_ == nullptr ? OnHeader() : OnMessage();
    }
    if (!s.ok() || done_) {
      // A failed put gives its reservation back before the writer hears the
      // status, so a retry of the same entry does not meet it (ABORTED).
      if (!s.ok()) session_.reset();
      return FinishOnce(s);
    }
    absl::MutexLock lock(&mu_);
    if (!finished_) StartRead(&raw_);  // else reclaimed meanwhile: no more reads
  }

  void OnCancel() override {
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "put cancelled by the client or the server's shutdown"));
  }

  void OnDone() override {
    if (reservation_id_ != 0) {
      absl::MutexLock lock(&service_.mu_);
      service_.active_puts_.erase(reservation_id_);
    }
    service_.metrics_.RecordPut(final_ok_, bytes_, absl::ToDoubleSeconds(absl::Now() - start_));
    delete this;  // the session, if not committed, aborts its put; the slot is given back
  }

  // The store reclaimed this put: end the stream with ABORTED.
  void Reclaim() override {
    FinishOnce(grpc::Status(grpc::StatusCode::ABORTED,
                            absl::StrCat("put reclaimed: no progress for put_timeout (",
                                         absl::FormatDuration(service_.store_.options().put_timeout), ")")));
  }

 private:
  grpc::Status OnHeader() {
    if (!msg_.has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a put stream starts with a header");
    }
    absl::StatusOr<PutSpec> spec = SpecOf(msg_.header());
    if (!spec.ok()) return ToGrpcStatus(spec.status());
    absl::StatusOr<std::unique_ptr<PutSession>> session = service_.store_.BeginPut(*spec);
    if (!session.ok()) return ToGrpcStatus(session.status());
    session_ = *std::move(session);
    answer_ = AnswerOf(*session_);
    if (session_->already_present()) {
      // Nothing to write: answer now; the client's remaining writes just fail.
      done_ = true;
      return grpc::Status::OK;
    }
    absl::MutexLock lock(&service_.mu_);
    reservation_id_ = session_->reservation_id();
    service_.active_puts_[reservation_id_] = this;
    return grpc::Status::OK;
  }

  // A chunk's checks, then its bytes through `fill`.
  grpc::Status WriteChunk(uint64_t offset, size_t size, absl::FunctionRef<void(uint8_t*)> fill) {
    if (static_cast<int64_t>(size) > service_.options_.max_chunk_bytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("chunk of ", size, " bytes exceeds ", service_.options_.max_chunk_bytes));
    }
    if (offset > static_cast<uint64_t>(INT64_MAX)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "chunk offset out of range");
    }
    return ToGrpcStatus(session_->WriteWith(static_cast<int64_t>(offset), static_cast<int64_t>(size), fill));
  }

  // A plain chunk decoded in place: one copy, from the slices to the entry.
  grpc::Status OnChunk() {
    return WriteChunk(chunk_.field(entry_messages::kChunkOffset), chunk_.data_size(),
                      [this](uint8_t* dst) { chunk_.CopyData(dst); });
  }

  grpc::Status OnMessage() {
    switch (msg_.message_case()) {
      case v1::PutRequest::kChunk: {
        const v1::PutChunk& c = msg_.chunk();
        return WriteChunk(c.offset(), c.data().size(),
                          [&c](uint8_t* dst) { std::memcpy(dst, c.data().data(), c.data().size()); });
      }
      case v1::PutRequest::kCommit: {
        absl::Status c = session_->Commit(msg_.commit().checksum());
        if (c.ok()) bytes_ = session_->size_bytes();
        done_ = true;
        return ToGrpcStatus(c);
      }
      case v1::PutRequest::kHeader:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a put stream carries one header");
      default:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty put message");
    }
  }

  void FinishOnce(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    final_ok_ = status.ok();
    if (status.ok()) {
      *response_ = entry_messages::SerializeMessage(answer_);
    }
    Finish(status);
  }

  CacheStoreService& service_;
  CallAdmission::Slot slot_;
  grpc::ByteBuffer* const response_;
  const absl::Time start_;
  grpc::ByteBuffer raw_;                // the message being read
  entry_messages::DecodedChunk chunk_;  // raw_ as a plain chunk
  v1::PutRequest msg_;                  // raw_ parsed by protobuf (header, commit, unusual chunks)
  v1::PutResponse answer_;
  std::unique_ptr<PutSession> session_;
  uint64_t reservation_id_ = 0;  // while in service_.active_puts_
  bool done_ = false;            // committed, failed to commit, or already present
  int64_t bytes_ = 0;            // committed bytes
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool final_ok_ = false;  // written under mu_ before Finish, read in OnDone
};

grpc::ServerReadReactor<grpc::ByteBuffer>* CacheStoreService::Put(grpc::CallbackServerContext* context,
                                                                  grpc::ByteBuffer* response) {
  absl::StatusOr<CallAdmission::Slot> slot = Admit(context);
  if (!slot.ok()) return new FinishedCall<grpc::ServerReadReactor<grpc::ByteBuffer>>(ToGrpcStatus(slot.status()));
  return new PutReactor(*this, *std::move(slot), response);
}

void CacheStoreService::CancelReclaimedPuts(const std::vector<uint64_t>& reservation_ids) {
  absl::MutexLock lock(&mu_);
  for (uint64_t id : reservation_ids) {
    auto it = active_puts_.find(id);
    if (it != active_puts_.end()) it->second->Reclaim();
  }
}

// One Get or GetMany stream: the entries of `keys`, in order, each opened
// (lease checked) when its turn comes and sent as ChunkMessage's messages,
// its checksum verified before its last one (WriteChunk), one write
// outstanding at a time; the next chunk goes out in
// OnWriteDone. The open entry's ReadHandle keeps its bytes alive until its
// last write is done (the last one until the reactor is deleted). A failed
// write (reader gone, call cancelled or deadline passed) ends the call; gRPC
// calls OnWriteDone serially, so each entry's metrics are recorded once.
template <typename Response>
class EntryStreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  EntryStreamReactor(CacheStoreService& service, CallAdmission::Slot slot, uint64_t lease_id, std::vector<Hash128> keys,
                     int64_t chunk)
      : service_(service), slot_(std::move(slot)), lease_id_(lease_id), keys_(std::move(keys)), chunk_(chunk) {
    NextEntry();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      service_.metrics_.RecordGet(false, 0, SecondsSince(entry_start_));
      return this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "reader went away"));
    }
    offset_ += chunk_;
    if (offset_ < EntrySize()) return WriteChunk();
    service_.metrics_.RecordGet(true, EntrySize(), SecondsSince(entry_start_));
    ++next_;
    NextEntry();
  }

  // A cancelled call fails the write outstanding (OnWriteDone(false)), which
  // finishes it: there is always one until Finish.
  void OnCancel() override {}

  void OnDone() override { delete this; }

 private:
  static constexpr bool kIndexed = std::is_same_v<Response, v1::GetManyResponse>;

  int64_t EntrySize() const { return static_cast<int64_t>(entry_->blob->size); }

  // Opens keys_[next_] and writes its first chunk, or finishes the call.
  void NextEntry() {
    for (; next_ < keys_.size(); ++next_) {
      entry_start_ = absl::Now();
      absl::StatusOr<ReadHandle> h = service_.store_.Open(lease_id_, keys_[next_]);
      if (!h.ok()) return FailEntry(h.status());
      entry_ = *std::move(h);
      offset_ = 0;
      checksum_.emplace();
      // Every entry opens with a message carrying its size and checksum,
      // an empty page (a model without attention layers) too.
      return WriteChunk();
    }
    this->Finish(grpc::Status::OK);
  }

  // The entry's bytes are hashed chunk by chunk as they go (while they are
  // in cache for gRPC's copy), not in a pass before the first: an entry whose
  // bytes fail their checksum never has its last chunk sent, so no reader
  // gets it whole; it is removed and the call ends with DATA_LOSS.
  void WriteChunk() {
    const int64_t n = std::min(chunk_, EntrySize() - offset_);
    checksum_->Update(entry_->blob->data.get() + offset_, static_cast<size_t>(n));
    if (offset_ + n == EntrySize()) {
      if (absl::Status s = service_.store_.CheckIntact(*entry_, checksum_->Digest()); !s.ok()) return FailEntry(s);
    }
    msg_ = ChunkMessage<Response>(*entry_, offset_, chunk_, static_cast<uint32_t>(next_));
    this->StartWrite(&msg_);
  }

  void FailEntry(absl::Status s) {
    service_.metrics_.RecordGet(false, 0, SecondsSince(entry_start_));
    if (kIndexed) s = absl::Status(s.code(), absl::StrCat("keys[", next_, "]: ", s.message()));
    this->Finish(ToGrpcStatus(s));
  }

  CacheStoreService& service_;
  CallAdmission::Slot slot_;
  const uint64_t lease_id_;
  const std::vector<Hash128> keys_;
  const int64_t chunk_;
  size_t next_ = 0;                  // index in keys_ of the entry being sent
  std::optional<ReadHandle> entry_;  // keys_[next_], open
  int64_t offset_ = 0;               // of the chunk in msg_
  absl::Time entry_start_;
  std::optional<common::StreamingChecksum> checksum_;  // of entry_'s bytes up to the end of msg_'s chunk
  grpc::ByteBuffer msg_;
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* CacheStoreService::Get(grpc::CallbackServerContext* context,
                                                                   const grpc::ByteBuffer* raw) {
  using Refused = FinishedCall<grpc::ServerWriteReactor<grpc::ByteBuffer>>;
  v1::GetRequest parsed;
  absl::StatusOr<CallAdmission::Slot> slot = AdmitRaw(context, *raw, &parsed);
  if (!slot.ok()) return new Refused(ToGrpcStatus(slot.status()));
  const v1::GetRequest* request = &parsed;
  absl::StatusOr<Hash128> key = KeyOf(request->key(), "key");
  if (!key.ok()) return new Refused(ToGrpcStatus(key.status()));
  return new EntryStreamReactor<v1::GetResponse>(*this, *std::move(slot), request->lease_id(), {*key},
                                                 ChunkBytes(request->chunk_bytes()));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CacheStoreService::GetMany(grpc::CallbackServerContext* context,
                                                                       const grpc::ByteBuffer* raw) {
  using Refused = FinishedCall<grpc::ServerWriteReactor<grpc::ByteBuffer>>;
  v1::GetManyRequest parsed;
  absl::StatusOr<CallAdmission::Slot> slot = AdmitRaw(context, *raw, &parsed);
  if (!slot.ok()) return new Refused(ToGrpcStatus(slot.status()));
  const v1::GetManyRequest* request = &parsed;
  if (request->keys_size() == 0 || request->keys_size() > options_.max_get_many_keys) {
    return new Refused(ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("GetMany takes 1 to ", options_.max_get_many_keys, " keys, got ", request->keys_size()))));
  }
  std::vector<Hash128> keys;
  keys.reserve(static_cast<size_t>(request->keys_size()));
  for (int i = 0; i < request->keys_size(); ++i) {
    absl::StatusOr<Hash128> key = KeyOf(request->keys(i), absl::StrCat("keys[", i, "]"));
    if (!key.ok()) return new Refused(ToGrpcStatus(key.status()));
    keys.push_back(*key);
  }
  return new EntryStreamReactor<v1::GetManyResponse>(*this, *std::move(slot), request->lease_id(), std::move(keys),
                                                     ChunkBytes(request->chunk_bytes()));
}

int64_t CacheStoreService::ChunkBytes(uint32_t requested) const {
  const int64_t chunk = requested == 0 ? options_.default_chunk_bytes : static_cast<int64_t>(requested);
  return std::clamp<int64_t>(chunk, 4096, options_.max_chunk_bytes);
}

grpc::Status CacheStoreService::AnswerRelease(const v1::ReleaseRequest& request) {
  return ToGrpcStatus(store_.Release(request.lease_id()));
}

grpc::Status CacheStoreService::AnswerStats(v1::StatsResponse* response) {
  IndexStats s = store_.Stats();
  FillClass(s.pages, response->mutable_pages());
  FillClass(s.states, response->mutable_states());
  response->set_namespaces(s.namespaces);
  response->set_namespaces_with_model_cost(static_cast<uint64_t>(s.namespaces_with_model_cost));
  response->set_active_leases(s.active_leases);
  response->set_active_puts(s.active_puts);
  response->set_pinned_states(static_cast<uint64_t>(s.pinned_states));
  response->set_pinned_bytes(static_cast<uint64_t>(s.pinned_bytes));
  response->set_lookups(s.lookups);
  response->set_lookup_hits(s.lookup_hits);
  response->set_hits_grid_checkpoint(s.hits_grid_checkpoint);
  response->set_hits_exact_prefix(s.hits_exact_prefix);
  response->set_checksum_failures(s.checksum_failures);
  response->set_expired_leases(s.expired_leases);
  response->set_expired_puts(s.expired_puts);
  response->set_shard_name(options_.shard_name);
  if (s.disk.enabled) {
    const DiskTierUsage& d = s.disk;
    v1::DiskTierStats* disk = response->mutable_disk();
    disk->set_entries(static_cast<uint64_t>(d.entries));
    disk->set_bytes(static_cast<uint64_t>(d.bytes));
    disk->set_budget_bytes(static_cast<uint64_t>(d.budget_bytes));
    disk->set_queued_bytes(static_cast<uint64_t>(d.queued_bytes));
    disk->set_writes(static_cast<uint64_t>(d.writes));
    disk->set_write_drops(static_cast<uint64_t>(d.write_drops));
    disk->set_write_failures(static_cast<uint64_t>(d.write_failures));
    disk->set_reads(static_cast<uint64_t>(d.reads));
    disk->set_read_hits(static_cast<uint64_t>(d.read_hits));
    disk->set_read_failures(static_cast<uint64_t>(d.read_failures));
    disk->set_promoted_entries(static_cast<uint64_t>(d.promoted_entries));
    disk->set_promoted_bytes(static_cast<uint64_t>(d.promoted_bytes));
    disk->set_shutdown_spilled(static_cast<uint64_t>(d.shutdown_spilled));
    disk->set_evictions(static_cast<uint64_t>(d.evictions));
  }
  return grpc::Status::OK;
}

}  // namespace hybridserve::cachestore
