#ifndef HYBRIDSERVE_TRANSPORT_FAKE_COMMUNICATOR_H_
#define HYBRIDSERVE_TRANSPORT_FAKE_COMMUNICATOR_H_

// An in-memory Communicator pair for tests of the protocols above it: each
// direction a bounded queue of messages (a Send blocks while the queue is
// full, as an ncclSend blocks until the peer posts its receive), and faults
// injected per message (FakeFault).
//
// Thread-safe: the factory and every link lock their own mutex.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/communicator.h"

namespace hybridserve::transport {

// A fault applied to the messages rank `from_rank` sends on one link,
// counted from 0 over the link's lifetime.
struct FakeFault {
  enum class Kind {
    kCorruptByte,  // message `message` arrives with byte `byte` flipped
    kResize,       // message `message` arrives `size` bytes long
    kBreak,        // the sender dies before message `message`: every call on both ends fails UNAVAILABLE
    kStall,        // messages from `message` on are swallowed: the peer waits until its deadline
  };
  Kind kind = Kind::kCorruptByte;
  int from_rank = 0;
  int64_t message = 0;
  size_t byte = 0;
  size_t size = 0;
};

class FakeCommunicatorFactory final : public CommunicatorFactory {
 public:
  // `queue_capacity`: messages in flight per direction before Send blocks.
  explicit FakeCommunicatorFactory(int queue_capacity = 4) : queue_capacity_(queue_capacity) {}

  // "fake-1", "fake-2", ...
  absl::StatusOr<std::string> NewUniqueId() ABSL_LOCKS_EXCLUDED(mu_) override;
  // INVALID_ARGUMENT for an id this factory did not make, a rank other than
  // 0 or 1, or a rank that already joined.
  absl::StatusOr<std::unique_ptr<Communicator>> Join(absl::string_view unique_id, int rank)
      ABSL_LOCKS_EXCLUDED(mu_) override;

  // Applies `fault` to the link `unique_id` (before or after its ranks join).
  // INVALID_ARGUMENT for an unknown id.
  absl::Status InjectFault(absl::string_view unique_id, const FakeFault& fault) ABSL_LOCKS_EXCLUDED(mu_);
  // The most recent id NewUniqueId returned ("" before the first).
  std::string last_unique_id() const ABSL_LOCKS_EXCLUDED(mu_);
  // Links made so far (NewUniqueId calls).
  int64_t links() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until rank `rank` of the link `unique_id` has received exactly
  // `messages` messages and is blocked in the Recv of the next one, or
  // `timeout` passes: how a test knows its fault strikes a receive in flight.
  // The bytes of the messages received are then in the receiver's buffers
  // and may be read (the link's mutex orders the copy before the return).
  // DEADLINE_EXCEEDED at the timeout (saying how many messages arrived),
  // INVALID_ARGUMENT for an unknown id.
  absl::Status AwaitReceiving(absl::string_view unique_id, int rank, int64_t messages, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether rank `rank` of the link `unique_id` is blocked in a Recv now
  // (false for an unknown id).
  bool Receiving(absl::string_view unique_id, int rank) const ABSL_LOCKS_EXCLUDED(mu_);

  class Link;

 private:
  // The link `unique_id` names, for rank `rank` (0 or 1); INVALID_ARGUMENT
  // naming what is wrong.
  absl::StatusOr<std::shared_ptr<Link>> FindLink(absl::string_view unique_id, int rank) const ABSL_LOCKS_EXCLUDED(mu_);

  const int queue_capacity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  std::string last_ ABSL_GUARDED_BY(mu_);
};

// The shared state of one pair: both queues, the joins, the faults.
class FakeCommunicatorFactory::Link {
 public:
  explicit Link(int queue_capacity) : queue_capacity_(queue_capacity) {}

  absl::Status JoinRank(int rank) ABSL_LOCKS_EXCLUDED(mu_);
  void AddFault(const FakeFault& fault) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WaitReady(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Send(int from_rank, const void* data, size_t bytes, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Recv(int rank, void* data, size_t bytes, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void Break() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status AwaitReceiving(int rank, int64_t messages, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  bool Receiving(int rank) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int queue_capacity_;
  absl::Mutex mu_;
  bool joined_[2] ABSL_GUARDED_BY(mu_) = {false, false};
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  int64_t sent_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  int64_t received_[2] ABSL_GUARDED_BY(mu_) = {0, 0};        // messages Recv copied out, by receiving rank
  bool receiving_[2] ABSL_GUARDED_BY(mu_) = {false, false};  // rank r is blocked in a Recv
  std::deque<std::string> to_[2] ABSL_GUARDED_BY(mu_);       // to_[r]: messages waiting for rank r
  std::vector<FakeFault> faults_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_FAKE_COMMUNICATOR_H_
