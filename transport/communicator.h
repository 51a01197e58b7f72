#ifndef HYBRIDSERVE_TRANSPORT_COMMUNICATOR_H_
#define HYBRIDSERVE_TRANSPORT_COMMUNICATOR_H_

// A two-rank point-to-point message channel, the layer under the channel
// data plane (transport/channel_protocol.h): NCCL on GPUs
// (transport/nccl_communicator.h), CUDA IPC between two processes on one GPU
// (transport/ipc_communicator.h), an in-memory pair in tests
// (transport/fake_communicator.h).
//
// The channel carries messages, not a byte stream: every Send of n bytes is
// matched by exactly one Recv of n bytes on the peer, in order (NCCL's
// ncclSend/ncclRecv contract). Both ranks must therefore know every size in
// advance; the protocol above sends fixed-size headers that announce the
// sizes of what follows.
//
// A call that fails leaves the channel unusable (NCCL cannot withdraw an
// operation it has posted, so a timed-out Recv would swallow the next
// message): its owner aborts it, the peer sees it as gone, and a new channel
// is bootstrapped with a new unique id.

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace hybridserve::transport {

// One end of a channel between rank 0 and rank 1.
//
// Thread-compatible for Send, Recv and WaitReady: one thread at a time (the
// protocol over it is a conversation, one message after another). Abort is
// thread-safe and may be called while another thread is blocked in a call.
class Communicator {
 public:
  virtual ~Communicator() = default;

  // This end's rank, 0 or 1.
  virtual int rank() const = 0;

  // Blocks until both ranks have joined the channel. UNAVAILABLE when the
  // channel failed or was aborted, DEADLINE_EXCEEDED at `deadline`. Send and
  // Recv wait for the join themselves; this bounds the wait separately.
  virtual absl::Status WaitReady(absl::Time deadline) = 0;

  // Sends `bytes` bytes at `data` as one message and blocks until the buffer
  // may be reused. `data` is host memory, or device memory where the
  // implementation says so (NCCL: either). UNAVAILABLE when the peer is gone
  // or the channel was aborted; DEADLINE_EXCEEDED when it did not complete by
  // `deadline` (the channel is then unusable).
  virtual absl::Status Send(const void* data, size_t bytes, absl::Time deadline) = 0;

  // Receives the next message, which must be `bytes` bytes long, into `data`.
  // UNAVAILABLE and DEADLINE_EXCEEDED as Send; a message of another size is
  // an error of the channel (DATA_LOSS from the fake; NCCL reports a
  // truncation or hangs until the deadline).
  virtual absl::Status Recv(void* data, size_t bytes, absl::Time deadline) = 0;

  // Fails every pending and later call on this end with UNAVAILABLE, and
  // makes the peer's calls fail too (at once in the fake; NCCL's peer
  // notices through its own error polling or its deadline).
  virtual void Abort() = 0;
};

// Creates channel ends. Thread-safe.
class CommunicatorFactory {
 public:
  virtual ~CommunicatorFactory() = default;

  // A new channel name to hand to the peer (NCCL: the 128 bytes of an
  // ncclUniqueId; the creating process hosts the bootstrap rendezvous).
  virtual absl::StatusOr<std::string> NewUniqueId() = 0;

  // Starts joining the channel `unique_id` as `rank` (0 or 1) and returns at
  // once; the join completes in the first WaitReady, Send or Recv, once the
  // peer has joined as the other rank. INVALID_ARGUMENT for a malformed id or
  // rank.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Join(absl::string_view unique_id, int rank) = 0;
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_COMMUNICATOR_H_
