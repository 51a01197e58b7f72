#include "cachestore/client/grpc_cache_client.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachestore/client/client_messages.h"
#include "cachestore/wire/entry_messages.h"
#include "common/grpc_status.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/cachestore.grpc.pb.h"

namespace hybridserve::cachestore {
namespace {

using common::FromGrpcStatus;

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
  out->metadata_bytes = static_cast<int64_t>(s.metadata_bytes());
}

constexpr char kGetMethod[] = "/hybridserve.v1.CacheStore/Get";
constexpr char kGetManyMethod[] = "/hybridserve.v1.CacheStore/GetMany";
constexpr char kPutMethod[] = "/hybridserve.v1.CacheStore/Put";
constexpr char kPutManyMethod[] = "/hybridserve.v1.CacheStore/PutMany";

// The header message of a put of `size` bytes in namespace `ns` (Put's and
// each of PutMany's entries).
v1::PutRequest HeaderMessage(const v1::CacheNamespace& ns, const ClientPut& put, size_t size) {
  v1::PutRequest msg;
  *msg.mutable_header() = PutHeaderMessage(ns, put, size);
  return msg;
}

// The chunk of `bytes` at `offset` (at most `chunk` bytes) as a PutRequest;
// it points into `bytes`, which must outlive the call: no copy.
grpc::ByteBuffer ChunkMessage(absl::string_view bytes, size_t offset, int64_t chunk) {
  const grpc::Slice data(bytes.data() + offset, std::min<size_t>(chunk, bytes.size() - offset),
                         grpc::Slice::STATIC_SLICE);
  return entry_messages::EncodeChunk({{entry_messages::kChunkOffset, offset}}, entry_messages::kChunkData, data,
                                     entry_messages::kPutChunk);
}

grpc::ByteBuffer CommitMessage(uint64_t checksum) {
  v1::PutRequest msg;
  msg.mutable_commit()->set_checksum(checksum);
  return entry_messages::SerializeMessage(msg);
}

// One call of a streaming method whose messages stay raw ByteBuffers (the
// generated stubs would copy an entry's bytes into and out of protobuf
// strings; entry_messages.h reads and writes them in place), driven step by step on
// its own completion queue. Every step returns whether it succeeded; a failed
// step means the call is over, and Finish says why.
class RawCall {
 public:
  RawCall(grpc::GenericStub& stub, const char* method, grpc::ClientContext* ctx)
      : ctx_(ctx), call_(stub.PrepareCall(ctx, method, &cq_)) {
    call_->StartCall(kStep);
    live_ = Wait(kStep);
  }
  ~RawCall() {
    if (!finished_) {
      ctx_->TryCancel();
      Finish();
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }
  RawCall(const RawCall&) = delete;
  RawCall& operator=(const RawCall&) = delete;

  bool Write(const grpc::ByteBuffer& message) {
    if (!live_) return false;
    call_->Write(message, kStep);
    return live_ = Wait(kStep);
  }
  bool WritesDone() {
    if (!live_) return false;
    call_->WritesDone(kStep);
    return Wait(kStep);
  }
  bool Read(grpc::ByteBuffer* message) {
    if (!live_) return false;
    call_->Read(message, kStep);
    return live_ = Wait(kStep);
  }
  // Starts reading the one answer of a client-streaming call while writes go
  // on: a server that answers early (already present, or an error) ends the
  // writes at once. AnswerArrived() waits for it.
  void StartAnswer(grpc::ByteBuffer* message) {
    if (!live_) return;
    call_->Read(message, kAnswer);
    answer_pending_ = true;
  }
  bool answered() const { return answered_; }
  bool AnswerArrived() {
    if (answer_pending_) Wait(kAnswer);
    return answered_;
  }
  // Keeps one read outstanding from now until the reads end: each message
  // that arrives while the writes go on is queued in arrived() (a
  // bidirectional call's answers).
  void StartReading() {
    if (!live_) return;
    reading_ = true;
    call_->Read(&incoming_, kRead);
  }
  std::deque<grpc::ByteBuffer>& arrived() { return arrived_; }
  // Waits until a message is queued in arrived() (true) or the reads end
  // (false: the server finished the call, or it failed).
  bool AwaitArrival() {
    while (arrived_.empty() && reading_) Wait(kRead);
    return !arrived_.empty();
  }
  grpc::Status Finish() {
    if (answer_pending_) Wait(kAnswer);
    while (reading_) Wait(kRead);
    grpc::Status status;
    call_->Finish(&status, kStep);
    Wait(kStep);
    finished_ = true;
    return status;
  }
  // Ends the call early (a malformed answer): cancels it and returns `why`.
  absl::Status Abandon(absl::Status why) {
    ctx_->TryCancel();
    Finish();
    return why;
  }

 private:
  static inline void* const kStep = reinterpret_cast<void*>(1);
  static inline void* const kAnswer = reinterpret_cast<void*>(2);
  static inline void* const kRead = reinterpret_cast<void*>(3);

  // Waits for the operation tagged `want`; the answer may complete meanwhile.
  bool Wait(void* want) {
    while (true) {
      void* tag = nullptr;
      bool ok = false;
      if (!cq_.Next(&tag, &ok)) return false;
      if (tag == kAnswer) {
        answer_pending_ = false;
        answered_ = ok;
        if (want == kAnswer) return ok;
        continue;
      }
      if (tag == kRead) {
        if (ok) {
          arrived_.push_back(std::move(incoming_));
          incoming_.Clear();
          call_->Read(&incoming_, kRead);
        } else {
          reading_ = false;
        }
        if (want == kRead) return ok;
        continue;
      }
      if (tag == want) return ok;
    }
  }

  grpc::ClientContext* const ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool live_ = false;
  bool finished_ = false;
  bool answer_pending_ = false;
  bool answered_ = false;
  bool reading_ = false;       // a kRead outstanding
  grpc::ByteBuffer incoming_;  // its message
  std::deque<grpc::ByteBuffer> arrived_;
};

// Writes the chunk of `bytes` at `off` (at most `chunk` bytes), then adds it
// to `sum` while gRPC sends it: the hash of an entry rides along with its
// chunks instead of a pass over the whole entry before its commit. False: as
// RawCall::Write.
bool WriteHashedChunk(RawCall& call, absl::string_view bytes, size_t off, int64_t chunk,
                      common::StreamingChecksum* sum) {
  const bool open = call.Write(ChunkMessage(bytes, off, chunk));
  sum->Update(bytes.data() + off, std::min<size_t>(static_cast<size_t>(chunk), bytes.size() - off));
  return open;
}

// Decodes one message of an entry stream whose data is field `data_field`.
// DATA_LOSS: the message is malformed.
absl::Status DecodeEntryChunk(const grpc::ByteBuffer& message, int data_field, entry_messages::DecodedChunk* chunk) {
  if (absl::Status s = entry_messages::DecodeChunk(message, data_field, 0, chunk); !s.ok()) {
    return absl::DataLossError(absl::StrCat("cachestore sent a malformed chunk: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

namespace grpc_client_internal {

// One entry of a Get or GetMany stream as its chunks arrive, into a string
// or into caller-owned segments: the size and checksum its first chunk
// announces, then its bytes in order. Until Begin, it expects 0 bytes with
// checksum 0.
class ArrivingEntry {
 public:
  explicit ArrivingEntry(std::string* dest) : string_(dest) {}
  // Into `segments` (kept by the caller), entry `index` of the call.
  ArrivingEntry(const EntrySegments* segments, size_t index) : segments_(segments), index_(index) {}

  // The announcement. DATA_LOSS: an implausible size (nothing is cleared);
  // INVALID_ARGUMENT: segments of another size (CheckEntryFits).
  absl::Status Begin(uint64_t size, uint64_t checksum) {
    if (size > (uint64_t{1} << 40)) return absl::DataLossError("cachestore announced an implausible entry size");
    if (segments_ != nullptr) RETURN_IF_ERROR(CheckEntryFits(index_, size, *segments_));
    size_ = size;
    checksum_ = checksum;
    sum_ = std::make_unique<common::StreamingChecksum>();
    if (string_ != nullptr) {
      string_->clear();
      string_->reserve(size);
    }
    return absl::OkStatus();
  }
  // DATA_LOSS: the chunk is not at `offset` == the bytes so far, or runs past
  // the size.
  absl::Status Append(uint64_t offset, const entry_messages::DecodedChunk& chunk) {
    if (offset != arrived_ || arrived_ + chunk.data_size() > size_) {
      return absl::DataLossError("cachestore sent chunks out of order or past the size");
    }
    if (string_ != nullptr) {
      chunk.AppendData(string_);  // straight from gRPC's slices
      // Hashed while the bytes just copied are in cache, not in a pass
      // over the whole entry at its end.
      sum_->Update(string_->data() + arrived_, chunk.data_size());
    } else {
      chunk.ForEachDataPiece([this](const char* p, size_t n) { Scatter(p, n); });
    }
    arrived_ += chunk.data_size();
    return absl::OkStatus();
  }
  // Whether every announced byte arrived and they match the checksum.
  bool Complete() const {
    if (arrived_ != size_) return false;
    return (sum_ != nullptr ? sum_->Digest() : common::Checksum64(nullptr, 0)) == checksum_;
  }

 private:
  // Copies bytes on into the segments, from where the last copy ended.
  void Scatter(const char* p, size_t n) {
    while (n > 0) {
      const absl::Span<char> s = segments_->segments[segment_];
      const size_t take = std::min(n, s.size() - within_);
      std::memcpy(s.data() + within_, p, take);
      sum_->Update(s.data() + within_, take);
      p += take;
      n -= take;
      within_ += take;
      if (within_ == s.size()) {
        ++segment_;
        within_ = 0;
      }
    }
  }

  std::string* const string_ = nullptr;
  const EntrySegments* const segments_ = nullptr;
  const size_t index_ = 0;
  size_t segment_ = 0, within_ = 0;  // where the next byte goes (segments)
  uint64_t arrived_ = 0;
  uint64_t size_ = 0;
  uint64_t checksum_ = 0;
  std::unique_ptr<common::StreamingChecksum> sum_;  // of the bytes so far, from Begin
};

}  // namespace grpc_client_internal

using grpc_client_internal::ArrivingEntry;

struct GrpcCacheClient::Impl {
  GrpcCacheClientOptions options;
  std::unique_ptr<v1::CacheStore::Stub> stub;
  std::unique_ptr<grpc::GenericStub> raw;  // Put, Get, GetMany: bytes in place

  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options.timeout));
  }
};

absl::StatusOr<std::unique_ptr<GrpcCacheClient>> GrpcCacheClient::Create(const std::string& target,
                                                                         const GrpcCacheClientOptions& options) {
  if (options.chunk_bytes <= 0 || options.chunk_bytes > (int64_t{64} << 20)) {
    return absl::InvalidArgumentError("chunk_bytes must be in (0, 64 MiB]");
  }
  grpc::ChannelArguments args;
  const int max_message = static_cast<int>(options.chunk_bytes + (1 << 20));
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  const int backoff_ms =
      static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(options.max_reconnect_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, backoff_ms);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(backoff_ms, 100));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, backoff_ms);  // also the shortest connect timeout
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, common::NewChannel(target, options.tls, args));
  impl->stub = v1::CacheStore::NewStub(channel);
  impl->raw = std::make_unique<grpc::GenericStub>(channel);
  return std::unique_ptr<GrpcCacheClient>(new GrpcCacheClient(std::move(impl)));
}

GrpcCacheClient::GrpcCacheClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcCacheClient::~GrpcCacheClient() = default;

absl::StatusOr<LookupResult> GrpcCacheClient::Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                                     LookupMode mode) {
  v1::LookupRequest req;
  *req.mutable_namespace_() = NamespaceMessage(ns);
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

absl::StatusOr<PutResult> GrpcCacheClient::Put(const ClientNamespace& ns, const ClientPut& put,
                                               absl::string_view bytes) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  RawCall call(*impl_->raw, kPutMethod, &ctx);
  // A failed Write means the server already answered (e.g. already present,
  // or an error); Finish tells which.
  grpc::ByteBuffer answer;
  bool open = call.Write(entry_messages::SerializeMessage(HeaderMessage(NamespaceMessage(ns), put, bytes.size())));
  call.StartAnswer(&answer);
  const int64_t chunk = impl_->options.chunk_bytes;
  common::StreamingChecksum sum;
  for (size_t off = 0; open && !call.answered() && off < bytes.size(); off += chunk) {
    open = WriteHashedChunk(call, bytes, off, chunk, &sum);
  }
  if (open && !call.answered()) call.Write(CommitMessage(sum.Digest()));
  call.WritesDone();
  v1::PutResponse resp;
  const bool answered = call.AnswerArrived();
  absl::Status s = FromGrpcStatus(call.Finish());
  if (!s.ok()) return s;
  if (!answered || !entry_messages::ParseMessage(answer, &resp))
    return absl::InternalError("cachestore sent a malformed put answer");
  return PutResultOf(resp);
}

std::vector<absl::StatusOr<PutResult>> GrpcCacheClient::PutMany(const ClientNamespace& ns,
                                                                absl::Span<const PutManyEntry> entries) {
  std::vector<absl::StatusOr<PutResult>> results;
  if (entries.empty()) return results;
  results.reserve(entries.size());
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  RawCall call(*impl_->raw, kPutManyMethod, &ctx);
  // The answers are read as they come, while the entries are written: an
  // entry answered early (already present, refused at its header) sends no
  // more of its bytes.
  call.StartReading();
  absl::Status broken;  // a malformed answer
  auto take_answers = [&] {
    for (; broken.ok() && !call.arrived().empty(); call.arrived().pop_front()) {
      v1::PutManyResponse a;
      if (!entry_messages::ParseMessage(call.arrived().front(), &a) || a.index() != results.size() ||
          results.size() >= entries.size()) {
        broken = absl::InternalError(
            absl::StrCat("cachestore sent a malformed or out-of-order PutMany answer after ", results.size()));
        return;
      }
      if (a.code() != 0) {
        results.push_back(absl::Status(static_cast<absl::StatusCode>(a.code()), a.message()));
      } else {
        results.push_back(PutResultOf(a.result()));
      }
    }
  };
  const v1::CacheNamespace proto_ns = NamespaceMessage(ns);
  const int64_t chunk = impl_->options.chunk_bytes;
  bool open = true;
  for (size_t i = 0; open && broken.ok() && i < entries.size(); ++i) {
    const PutManyEntry& e = entries[i];
    open = call.Write(entry_messages::SerializeMessage(HeaderMessage(proto_ns, *e.put, e.bytes.size())));
    take_answers();
    common::StreamingChecksum sum;
    for (size_t off = 0; open && results.size() <= i && off < e.bytes.size(); off += chunk) {
      open = e.checksum.has_value() ? call.Write(ChunkMessage(e.bytes, off, chunk))
                                    : WriteHashedChunk(call, e.bytes, off, chunk, &sum);
      take_answers();
    }
    if (open && results.size() <= i) open = call.Write(CommitMessage(e.checksum.value_or(sum.Digest())));
  }
  if (broken.ok()) {
    call.WritesDone();
    while (broken.ok() && call.AwaitArrival()) take_answers();
  }
  if (!broken.ok()) {
    const absl::Status why = call.Abandon(broken);
    results.resize(entries.size(), why);  // malformed answers are never results
    return results;
  }
  absl::Status s = FromGrpcStatus(call.Finish());
  if (results.size() < entries.size()) {
    if (s.ok()) {
      s = absl::InternalError(absl::StrCat("cachestore ended PutMany after answering ", results.size(), " of ",
                                           entries.size(), " entries"));
    }
    results.resize(entries.size(), s);
  }
  return results;
}

absl::Status GrpcCacheClient::GetInto(uint64_t lease_id, const Hash128& key, std::string* out) {
  v1::GetRequest req;
  req.set_lease_id(lease_id);
  req.set_key(key.ToBytes());
  req.set_chunk_bytes(static_cast<uint32_t>(impl_->options.chunk_bytes));
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  RawCall call(*impl_->raw, kGetMethod, &ctx);
  call.Write(entry_messages::SerializeMessage(req));
  call.WritesDone();
  out->clear();
  ArrivingEntry entry(out);
  bool first = true;
  grpc::ByteBuffer message;
  entry_messages::DecodedChunk chunk;
  while (call.Read(&message)) {
    if (absl::Status s = DecodeEntryChunk(message, entry_messages::kGetData, &chunk); !s.ok()) return call.Abandon(s);
    if (first) {
      absl::Status s =
          entry.Begin(chunk.field(entry_messages::kGetSizeBytes), chunk.field(entry_messages::kGetChecksum));
      if (!s.ok()) return call.Abandon(s);
      first = false;
    }
    if (absl::Status s = entry.Append(chunk.field(entry_messages::kGetOffset), chunk); !s.ok()) return call.Abandon(s);
  }
  absl::Status s = FromGrpcStatus(call.Finish());
  if (!s.ok()) return s;
  if (!entry.Complete()) {
    return absl::DataLossError(absl::StrCat("entry ", key.ToHex(), " arrived incomplete or corrupted"));
  }
  return absl::OkStatus();
}

absl::Status GrpcCacheClient::GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys,
                                          absl::Span<std::string> out) {
  if (keys.empty() || keys.size() != out.size()) return CacheClient::GetManyInto(lease_id, keys, out);
  return GetManyStream(lease_id, keys, [out](size_t i) { return ArrivingEntry(&out[i]); });
}

absl::Status GrpcCacheClient::GetManyScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                               absl::Span<const EntrySegments> out) {
  if (keys.empty() || keys.size() != out.size()) return CacheClient::GetManyScattered(lease_id, keys, out);
  return GetManyStream(lease_id, keys, [out](size_t i) { return ArrivingEntry(&out[i], i); });
}

absl::Status GrpcCacheClient::GetManyStream(uint64_t lease_id, absl::Span<const Hash128> keys,
                                            absl::FunctionRef<ArrivingEntry(size_t index)> entry_for) {
  v1::GetManyRequest req;
  req.set_lease_id(lease_id);
  for (const Hash128& key : keys) req.add_keys(key.ToBytes());
  req.set_chunk_bytes(static_cast<uint32_t>(impl_->options.chunk_bytes));
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  RawCall call(*impl_->raw, kGetManyMethod, &ctx);
  call.Write(entry_messages::SerializeMessage(req));
  call.WritesDone();
  // The entry being received: keys[current].
  int64_t current = -1;
  std::optional<ArrivingEntry> entry;
  auto finish_entry = [&]() -> absl::Status {
    if (!entry->Complete()) {
      return absl::DataLossError(absl::StrCat("keys[", current, "] (", keys[static_cast<size_t>(current)].ToHex(),
                                              ") arrived incomplete or corrupted"));
    }
    return absl::OkStatus();
  };
  grpc::ByteBuffer message;
  entry_messages::DecodedChunk chunk;
  while (call.Read(&message)) {
    if (absl::Status s = DecodeEntryChunk(message, entry_messages::kManyData, &chunk); !s.ok()) return call.Abandon(s);
    const uint64_t index = chunk.field(entry_messages::kManyIndex);
    if (static_cast<int64_t>(index) != current) {
      // A new entry: the next index, starting at offset 0 with its size.
      if (current >= 0) {
        if (absl::Status s = finish_entry(); !s.ok()) return call.Abandon(s);
      }
      if (static_cast<int64_t>(index) != current + 1 || index >= keys.size() ||
          chunk.field(entry_messages::kManyOffset) != 0) {
        return call.Abandon(absl::DataLossError("cachestore sent GetMany entries out of order"));
      }
      current = static_cast<int64_t>(index);
      entry.emplace(entry_for(static_cast<size_t>(current)));
      absl::Status s =
          entry->Begin(chunk.field(entry_messages::kManySizeBytes), chunk.field(entry_messages::kManyChecksum));
      if (!s.ok()) return call.Abandon(s);
    }
    if (absl::Status s = entry->Append(chunk.field(entry_messages::kManyOffset), chunk); !s.ok()) {
      return call.Abandon(s);
    }
  }
  absl::Status s = FromGrpcStatus(call.Finish());
  if (!s.ok()) return s;
  if (current != static_cast<int64_t>(keys.size()) - 1) {
    return absl::DataLossError(absl::StrCat("GetMany ended after ", current + 1, " of ", keys.size(), " entries"));
  }
  return finish_entry();
}

absl::Status GrpcCacheClient::Release(uint64_t lease_id) {
  v1::ReleaseRequest req;
  req.set_lease_id(lease_id);
  v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  return FromGrpcStatus(impl_->stub->Release(&ctx, req, &resp));
}

absl::StatusOr<IndexStats> GrpcCacheClient::Stats() {
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
  out.namespaces_with_model_cost = static_cast<int64_t>(resp.namespaces_with_model_cost());
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
  out.shard_name = resp.shard_name();
  return out;
}

}  // namespace hybridserve::cachestore
