#ifndef HYBRIDSERVE_TRANSPORT_TCP_TRANSPORT_H_
#define HYBRIDSERVE_TRANSPORT_TCP_TRANSPORT_H_

// The TCP data plane, the CPU default: a decode-side listener
// (TcpStateReceiver) and a prefill-side sender (TcpStateSender) speaking the
// frames of transport/frame.h, one connection per transfer.
//
// Who may send. The port accepts a connection from anyone who can reach it;
// a connection is served only once its first frame is an intact kBegin
// (header and payload checksums, version 2, at most kBeginPayloadBytes read)
// whose transfer id is expected and whose secret is that ticket's
// (TransferRegistry::Begin, compared in constant time before the transfer is
// claimed). Anything else (no byte before the peer closes or idle_timeout
// passes, garbage, another frame first, a version 1 sender, an id not
// expected, another secret) is dropped: the connection is closed without an
// answer, no expected transfer is touched (its rightful sender can still
// deliver it), the drop is counted in unauthenticated() and logged (one line
// per 10 s, with a count of those held back). A late sender of a forgotten
// transfer (cancelled, past its deadline) is dropped the same way: its
// ticket, secret included, is forgotten. Strangers that connect and send
// nothing are bounded by what bounds every connection: each holds a thread
// and a socket for at most idle_timeout, and at most max_connections are
// served at once (the ones beyond are closed at once, counted in refused()).
// That bounds the receiver's resources, not its availability: a flood of
// such connections can keep the rightful senders out while it lasts, so the
// port should be reachable only from prefill workers (a network policy). The
// bytes travel in plain text: the secret proves who sends, it does not hide
// what is sent.
//
// Once a sender has proved its ticket, the receiver checks every frame
// before it keeps a byte: the announced sizes against the ticket (before
// allocating), the checksums, the page order, and answers every refusal
// (counted in refused()). A peer that goes away or stalls for
// `idle_timeout` fails its transfer on both sides (Await returns UNAVAILABLE;
// Send returns UNAVAILABLE or DEADLINE_EXCEEDED), and the receiver forgets it.
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/connection_server.h"
#include "common/log_rate_limiter.h"
#include "common/socket_io.h"
#include "transport/frame.h"
#include "transport/page_block.h"
#include "transport/transfer.h"
#include "transport/transfer_registry.h"

namespace hybridserve::transport {

// The socket buffers a transfer connection asks for on each side: 4 MiB.
// Measured on a 2-core VM, 1024 pages of 64 KiB over loopback took 36-38 ms
// with them against 47-50 ms from autotuning's start.
inline constexpr int kTransferSocketBufferBytes = 4 << 20;

struct TcpReceiverOptions {
  std::string address = "127.0.0.1:0";  // where to listen; port 0: any free port
  // A connection that makes no progress for this long fails its transfer.
  absl::Duration idle_timeout = absl::Seconds(10);
  int max_connections = 64;  // beyond it new connections are closed at once
  // Memory of finished transfers' pages kept for the next transfers of the
  // same size (already faulted in); 0 keeps none.
  int64_t max_idle_page_bytes = int64_t{256} << 20;
  // Each connection's receive buffer (SO_RCVBUF, which the kernel caps at
  // net.core.rmem_max); 0 leaves the kernel's autotuning. A transfer is one
  // new connection, so autotuning would start it small each time.
  int socket_buffer_bytes = kTransferSocketBufferBytes;
  TransferRegistry::Limits limits;
};

class TcpStateReceiver final : public StateReceiver {
 public:
  // UNAVAILABLE when the address cannot be bound (port in use);
  // INVALID_ARGUMENT for a malformed address or option.
  static absl::StatusOr<std::unique_ptr<TcpStateReceiver>> Create(const TcpReceiverOptions& options);
  // Stops accepting, wakes and joins every connection.
  ~TcpStateReceiver() override;

  // "host:port" that senders connect to (the bound port).
  const std::string& endpoint() const { return endpoint_; }

  TransportKind kind() const override { return TransportKind::kTcp; }
  absl::Status Expect(const Ticket& ticket) override { return registry_.Expect(ticket); }
  absl::StatusOr<ReceivedState> Await(uint64_t transfer_id) override { return registry_.Await(transfer_id); }
  void Cancel(uint64_t transfer_id) override { registry_.Cancel(transfer_id); }
  int64_t pending() const override { return registry_.pending(); }
  int64_t refused() const override { return registry_.refused(); }
  int64_t unauthenticated() const override { return registry_.unauthenticated(); }
  // Connections being served now.
  int64_t connections() const;

 private:
  TcpStateReceiver(const TcpReceiverOptions& options, std::string endpoint);
  void Serve(common::Socket* socket);
  // Reads the first frame of `socket` into `*h` and `*begin` and claims its
  // transfer (Begin) when it presents the ticket's secret: the ticket.
  // UNAUTHENTICATED (counted) when the peer proved no ticket: drop it
  // without a word. Begin's other refusals: answer them.
  absl::StatusOr<Ticket> Admit(common::Socket& socket, FrameHeader* h, BeginPayload* begin);
  // Receives the rest of the claimed transfer `transfer_id` on `socket`; the
  // status to acknowledge. A failure fails the transfer in the registry.
  // `first_page`: the begin frame's index, the first page the sender sends.
  absl::Status Receive(common::Socket& socket, uint64_t transfer_id, uint64_t first_page, const BeginPayload& begin,
                       const Ticket& ticket);
  absl::Status ReceiveBegun(common::Socket& socket, uint64_t transfer_id, uint64_t first_page,
                            const BeginPayload& begin, const Ticket& ticket);

  const TcpReceiverOptions options_;
  TransferRegistry registry_;
  const std::shared_ptr<PageBlockRecycler> recycler_;
  const std::string endpoint_;
  common::LogRateLimiter log_limiter_;  // the drops of peers that proved no ticket
  std::atomic<bool> stop_{false};       // set before connections_ goes
  // Last: its connections use everything above until it is gone.
  std::unique_ptr<common::ConnectionServer> connections_;
};

struct TcpSenderOptions {
  absl::Duration connect_timeout = absl::Seconds(5);
  // The longest wait for the receiver to take a frame or to acknowledge,
  // besides the ticket's deadline.
  absl::Duration io_timeout = absl::Seconds(10);
  // The connection's send buffer (SO_SNDBUF, capped at net.core.wmem_max);
  // 0 leaves the kernel's autotuning.
  int socket_buffer_bytes = kTransferSocketBufferBytes;
};

class TcpStateSender final : public StateSender {
 public:
  explicit TcpStateSender(const TcpSenderOptions& options = {}) : options_(options) {}

  absl::Status Send(const Ticket& ticket, const StateSource& source) override;

 private:
  const TcpSenderOptions options_;
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_TCP_TRANSPORT_H_
