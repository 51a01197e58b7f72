// CacheStoreService::PutMany: several puts in one stream
// (proto/cachestore.proto, PutMany).

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachestore/server/put_header.h"
#include "cachestore/server/service.h"
#include "cachestore/wire/entry_messages.h"
#include "common/grpc_status.h"

namespace hybridserve::cachestore {
namespace {

// Answers waiting to be written beyond which the stream stops reading, until
// the client reads them: a client that never reads its answers cannot make
// the server queue one per entry without end.
constexpr size_t kMaxQueuedAnswers = 64;

}  // namespace

// One PutMany stream: entries one after another, each a header, chunks in
// order and a commit, as Put's; one entry in flight at a time, so a stream
// holds at most one reservation and an entry may hang from the one before.
//
// gRPC calls OnReadDone serially, and OnWriteDone serially, but the two may
// run at once; Reclaim comes from the reaper thread and OnCancel from gRPC.
// The entry (session_, state_, index_) is touched only by OnReadDone and
// OnDone, which never run at the same time. The answers queue, the one write
// in flight and the finish are under mu_. The stream finishes once, after the
// answers queued before it are written (a failed write drops them).
class PutManyReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>, public ReclaimablePut {
 public:
  PutManyReactor(CacheStoreService& service, CallAdmission::Slot slot) : service_(service), slot_(std::move(slot)) {
    StartRead(&raw_);
  }

  void OnReadDone(bool ok) override {
    grpc::Status s;
    if (!ok) {
      // Half-closed (or cancelled): the end of the entries, unless one is
      // open.
      if (state_ == State::kWriting) {
        s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         absl::StrCat("put_many entry ", index_.load(), ": stream ended before its commit: ",
                                      session_->bytes_written(), " of ", session_->size_bytes(), " bytes arrived"));
        EndEntry();
      }
      return FinishOnce(s);
    }
    if (state_ != State::kBetween &&
        entry_messages::DecodeChunk(raw_, entry_messages::kChunkData, entry_messages::kPutChunk, &chunk_).ok()) {
      // The bulk of a stream: a plain chunk, decoded in place.
      s = state_ == State::kSkipping ? grpc::Status::OK
                                     : WriteChunk(chunk_.field(entry_messages::kChunkOffset), chunk_.data_size(),
                                                  [this](uint8_t* dst) { chunk_.CopyData(dst); });
    } else if (!entry_messages::ParseMessage(raw_, &msg_)) {
      s = Protocol("malformed put message");
    } else {
      s = OnMessage();
    }
    if (!s.ok()) {
      // The entry in flight gives its reservation back before the client
      // hears the status.
      EndEntry();
      return FinishOnce(s);
    }
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // reclaimed or cancelled meanwhile: no more reads
    if (answers_.size() < kMaxQueuedAnswers) {
      StartRead(&raw_);
    } else {
      read_paused_ = true;  // OnWriteDone resumes
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    answers_.pop_front();
    if (!ok) {
      // The client is gone (or the call was cancelled): nothing more is
      // written; the read outstanding fails too.
      answers_.clear();
      writing_ = false;
      if (!finished_) {
        finished_ = true;
        final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "put_many: the client stopped reading");
      }
      Finish(*final_status_);
      return;
    }
    if (!answers_.empty()) {
      StartWrite(&answers_.front());
      return;
    }
    writing_ = false;
    if (finished_) {
      Finish(*final_status_);
      return;
    }
    if (read_paused_) {
      read_paused_ = false;
      StartRead(&raw_);
    }
  }

  void OnCancel() override {
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "put_many cancelled by the client or the server's shutdown"));
  }

  void OnDone() override {
    EndEntry();   // the session, if not committed, aborts its put
    delete this;  // the slot is given back
  }

  void Reclaim() override {
    FinishOnce(grpc::Status(grpc::StatusCode::ABORTED,
                            absl::StrCat("put_many entry ", index_.load(), " reclaimed: no progress for put_timeout (",
                                         absl::FormatDuration(service_.store_.options().put_timeout), ")")));
  }

 private:
  enum class State {
    kBetween,   // expecting a header
    kWriting,   // session_ open: chunks, then the commit
    kSkipping,  // the entry is answered: its chunks and commit are dropped
  };

  grpc::Status Protocol(absl::string_view what) const {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("put_many entry ", index_.load(), ": ", what));
  }

  grpc::Status OnMessage() {
    switch (msg_.message_case()) {
      case v1::PutRequest::kHeader:
        if (state_ == State::kWriting) return Protocol("a header before the entry's commit");
        if (started_) ++index_;
        started_ = true;
        BeginEntry();
        return grpc::Status::OK;
      case v1::PutRequest::kChunk: {
        if (state_ == State::kBetween) return Protocol("a chunk outside an entry");
        if (state_ == State::kSkipping) return grpc::Status::OK;
        const v1::PutChunk& c = msg_.chunk();
        return WriteChunk(c.offset(), c.data().size(),
                          [&c](uint8_t* dst) { std::memcpy(dst, c.data().data(), c.data().size()); });
      }
      case v1::PutRequest::kCommit: {
        if (state_ == State::kBetween) return Protocol("a commit outside an entry");
        if (state_ == State::kSkipping) {
          state_ = State::kBetween;
          return grpc::Status::OK;
        }
        absl::Status c = session_->Commit(msg_.commit().checksum());
        if (c.ok() || c.code() == absl::StatusCode::kDataLoss || c.code() == absl::StatusCode::kAborted) {
          // Committed; or refused for this entry alone (DATA_LOSS: nothing
          // committed; ABORTED: its reservation was lost).
          const int64_t bytes = session_->size_bytes();
          if (c.ok()) {
            Answer(c, AnswerOf(*session_), bytes);
          } else {
            EndEntry();
            Answer(c, {}, 0);
          }
          EndEntry();
          state_ = State::kBetween;
          return grpc::Status::OK;
        }
        return Protocol(c.message());  // not all bytes arrived
      }
      default:
        return Protocol("empty put message");
    }
  }

  // The header in msg_: answered at once when refused or already present,
  // else the entry is open.
  void BeginEntry() {
    entry_start_ = absl::Now();
    state_ = State::kSkipping;
    absl::StatusOr<PutSpec> spec = SpecOf(msg_.header());
    if (!spec.ok()) return Answer(spec.status(), {}, 0);
    absl::StatusOr<std::unique_ptr<PutSession>> session = service_.store_.BeginPut(*spec);
    if (!session.ok()) return Answer(session.status(), {}, 0);
    if ((*session)->already_present()) return Answer(absl::OkStatus(), AnswerOf(**session), 0);
    session_ = *std::move(session);
    state_ = State::kWriting;
    absl::MutexLock lock(&service_.mu_);
    service_.active_puts_[session_->reservation_id()] = this;
  }

  // A chunk's checks, then its bytes through `fill`. A chunk of a reclaimed
  // entry (ABORTED) refuses the entry alone; every other failure is the
  // client's breach of the protocol.
  grpc::Status WriteChunk(uint64_t offset, size_t size, absl::FunctionRef<void(uint8_t*)> fill) {
    if (static_cast<int64_t>(size) > service_.options_.max_chunk_bytes) {
      return Protocol(absl::StrCat("chunk of ", size, " bytes exceeds ", service_.options_.max_chunk_bytes));
    }
    if (offset > static_cast<uint64_t>(INT64_MAX)) return Protocol("chunk offset out of range");
    absl::Status w = session_->WriteWith(static_cast<int64_t>(offset), static_cast<int64_t>(size), fill);
    if (w.code() == absl::StatusCode::kAborted) {
      EndEntry();
      Answer(w, {}, 0);
      state_ = State::kSkipping;
      return grpc::Status::OK;
    }
    return w.ok() ? grpc::Status::OK : Protocol(w.message());
  }

  // Ends the entry in flight, if any: unregistered, and its session closed
  // (an uncommitted put is aborted, its reservation freed).
  void EndEntry() {
    if (session_ == nullptr) return;
    {
      absl::MutexLock lock(&service_.mu_);
      service_.active_puts_.erase(session_->reservation_id());
    }
    session_.reset();
  }

  // Queues the current entry's answer: `status`, and `result` when OK.
  void Answer(const absl::Status& status, v1::PutResponse result, int64_t bytes) {
    service_.metrics_.RecordPut(status.ok(), bytes, absl::ToDoubleSeconds(absl::Now() - entry_start_));
    v1::PutManyResponse answer;
    answer.set_index(index_);
    if (status.ok()) {
      *answer.mutable_result() = std::move(result);
    } else {
      answer.set_code(static_cast<int32_t>(status.code()));
      answer.set_message(std::string(status.message()));
    }
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    answers_.push_back(entry_messages::SerializeMessage(answer));
    if (!writing_) {
      writing_ = true;
      StartWrite(&answers_.front());
    }
  }

  void FinishOnce(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    final_status_ = status;
    if (!writing_) Finish(status);  // else after the queued answers (OnWriteDone)
  }

  CacheStoreService& service_;
  CallAdmission::Slot slot_;
  grpc::ByteBuffer raw_;                // the message being read
  entry_messages::DecodedChunk chunk_;  // raw_ as a plain chunk
  v1::PutRequest msg_;                  // raw_ parsed by protobuf (headers, commits, unusual chunks)
  // The entry: touched by OnReadDone and OnDone only (index_ read by Reclaim).
  State state_ = State::kBetween;
  bool started_ = false;                 // a header has arrived
  std::atomic<uint32_t> index_{0};       // the current (or last) entry's index
  std::unique_ptr<PutSession> session_;  // while kWriting
  absl::Time entry_start_;
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> answers_ ABSL_GUARDED_BY(mu_);  // front: being written while writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> final_status_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CacheStoreService::PutMany(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<CallAdmission::Slot> slot = Admit(context);
  if (!slot.ok()) {
    // Refused: finished at once, deleted when gRPC is done with it.
    class Refused final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
     public:
      explicit Refused(const grpc::Status& status) { Finish(status); }
      void OnDone() override { delete this; }
    };
    return new Refused(common::ToGrpcStatus(slot.status()));
  }
  return new PutManyReactor(*this, *std::move(slot));
}

}  // namespace hybridserve::cachestore
