#ifndef HYBRIDSERVE_TRANSPORT_IPC_COMMUNICATOR_H_
#define HYBRIDSERVE_TRANSPORT_IPC_COMMUNICATOR_H_

// A Communicator (transport/communicator.h) between two processes on one GPU,
// where NCCL refuses two ranks on one device: the channel protocol of
// transport/channel_protocol.h runs over it unchanged (TransportKind::kCudaIpc).
//
// Every message is a rendezvous over a TCP control connection on the host:
// the receiving rank posts its buffer ("ready": size, and, when the buffer is
// device memory its backend can share, the CUDA IPC handle of the buffer's
// allocation and the offset in it); the sending rank then either copies its
// bytes straight into that device memory (PeerMemory::CopyToPeer: device to
// device when the source is device memory too, with no host staging) and
// says "done", or sends the bytes over the connection (a host buffer on
// either side, or a backend without shared memory: the CPU). A receive of
// another size than the send is DATA_LOSS on the sending side, which then
// breaks the channel. Opened handles are cached per channel (opening costs
// milliseconds) and closed with it.
//
// The unique id is "host:port/token": NewUniqueId listens on host:0 (this
// process hosts the rendezvous, as with NCCL) and draws the token, 128 random
// bits from getrandom(2) as 32 hex digits (transfer_secret.h). Rank 1
// connects and presents the token as its first 32 bytes; rank 0 compares
// them in constant time (SecretsEqual) before it reads anything else, and
// closes a connection that presents anything else, closes, or stays silent
// past `token_timeout`. It reads the connections side by side, so silent
// strangers delay no one (at most 64 at once). The id reaches the peer inside
// a ticket, through the Prefill call: holding the token proves the peer was
// given the channel by decode, and the channel's transfers then prove their
// tickets with their own secrets (channel_protocol.h). The control
// connection is plain TCP (by default on 127.0.0.1): the token is not
// replayable by anyone who cannot read it, and nothing on it is encrypted.
//
// Failures: a peer that dies closes the connection (UNAVAILABLE at once); a
// peer that stalls runs a call into its deadline (DEADLINE_EXCEEDED); Abort
// shuts the connection down, which the peer sees as gone. After any failure
// the channel is unusable, as the Communicator contract says.
//
// Thread-safe factory; channels as Communicator says.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/socket_io.h"
#include "kernels/peer_memory.h"
#include "transport/communicator.h"

namespace hybridserve::transport {

struct IpcCommunicatorOptions {
  // Where NewUniqueId listens for the peer's control connection.
  std::string listen_host = "127.0.0.1";
  // How long rank 0 reads a new connection for the token before it closes
  // it (the peer presents it as soon as it connects).
  absl::Duration token_timeout = absl::Seconds(5);
};

// Bytes a channel sent each way, for tests.
struct IpcChannelStats {
  int64_t bytes_by_ipc = 0;     // copied into the peer's device memory
  int64_t bytes_by_socket = 0;  // sent over the control connection
  int64_t handles_opened = 0;   // distinct peer allocations opened
};

// Message bytes every channel of one factory moved, since the factory was
// made (closed channels included), by path: a device copy into the
// receiver's device memory (PeerMemory::CopyToPeer), or the control
// connection. Counted on both ends: the sender counts what it sent, the
// receiver what it received. Message payloads only: the control messages'
// own headers and handles are not counted. For the data-plane metrics.
struct IpcTraffic {
  int64_t sent_by_device_copy = 0;
  int64_t sent_by_socket = 0;
  int64_t received_by_device_copy = 0;
  int64_t received_by_socket = 0;
};

struct IpcTrafficCounters;  // ipc_communicator.cc

class IpcCommunicatorFactory final : public CommunicatorFactory {
 public:
  // `peer_memory`: the engine's backend's (Backend::peer_memory(), on the GPU
  // both processes share), used from the channels' threads (it is
  // thread-safe); it must outlive the factory and every channel. Null (a
  // backend that shares no memory, the CPU's): every message goes over the
  // control connection.
  explicit IpcCommunicatorFactory(kernels::PeerMemory* peer_memory, const IpcCommunicatorOptions& options = {});
  ~IpcCommunicatorFactory() override;

  // "host:port/token"; UNAVAILABLE when it cannot listen.
  absl::StatusOr<std::string> NewUniqueId() ABSL_LOCKS_EXCLUDED(mu_) override;
  // Rank 0 takes the listener NewUniqueId made (INVALID_ARGUMENT for an id
  // this factory did not make or already joined); rank 1 connects to the id's
  // address in its first call. INVALID_ARGUMENT for a malformed id or rank.
  absl::StatusOr<std::unique_ptr<Communicator>> Join(absl::string_view unique_id, int rank)
      ABSL_LOCKS_EXCLUDED(mu_) override;

  // What its channels moved so far. Thread-safe.
  IpcTraffic traffic() const;

 private:
  kernels::PeerMemory* const peer_memory_;  // may be null
  const IpcCommunicatorOptions options_;
  // Shared with the channels, which may outlive the factory.
  const std::shared_ptr<IpcTrafficCounters> traffic_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, common::Socket> listeners_ ABSL_GUARDED_BY(mu_);  // by unique id, until rank 0 joins
};

// Stats of a channel made by IpcCommunicatorFactory (zero for any other).
IpcChannelStats StatsOf(const Communicator& channel);
// Traffic of an IpcCommunicatorFactory (zero for any other factory).
IpcTraffic TrafficOf(const CommunicatorFactory& factory);

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_IPC_COMMUNICATOR_H_
