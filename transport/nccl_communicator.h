#ifndef HYBRIDSERVE_TRANSPORT_NCCL_COMMUNICATOR_H_
#define HYBRIDSERVE_TRANSPORT_NCCL_COMMUNICATOR_H_

// Communicator (transport/communicator.h) over NCCL: a two-rank
// communicator per channel (ncclGetUniqueId on the side that makes the
// channel, ncclCommInitRankConfig non-blocking with nranks 2 on both), and
// ncclSend/ncclRecv on the channel's own stream. Every wait polls the stream
// and ncclCommGetAsyncError and aborts the communicator (ncclCommAbort) at
// its deadline or on an NCCL error, so a dead or stalled peer costs at most
// the caller's deadline; Abort() interrupts a blocked call. Messages accept
// host memory (copied through a device staging buffer, 4 MiB chunks) or
// device memory (sent in place). The NCCL and CUDA calls live in
// nccl_ops.cu; this header and its .cc include no CUDA header.
//
// The unique id is the proof of the channel. ncclGetUniqueId draws a random
// 64-bit magic into it beside the bootstrap root's address, and NCCL's
// bootstrap drops every connection that does not open with that magic
// (socketFinalizeAccept in NCCL's socket.cc): only a process that holds the
// id joins the channel, and the id reaches prefill only inside a ticket,
// through the Prefill call. 64 bits suffice against guessing over the
// network (one connection per guess). NCCL_COMM_ID would replace the random
// magic with NCCL's constant (and every channel's root with one fixed
// address): Create refuses to run with it set. Per transfer, the begin
// frame's secret is checked as on every plane (channel_protocol.h). NCCL's
// traffic is not encrypted.
//
// The factory is thread-safe; each communicator as Communicator says.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/communicator.h"

namespace hybridserve::transport {

struct NcclCommunicatorOptions {
  int device = 0;  // the CUDA device of every channel this factory makes
};

class NcclCommunicatorFactory final : public CommunicatorFactory {
 public:
  // UNAVAILABLE on a machine without a CUDA device or driver (the NCCL data
  // plane needs a GPU; the TCP one does not); INTERNAL when counting devices
  // fails otherwise (a broken CUDA setup); INVALID_ARGUMENT for a device out
  // of range; FAILED_PRECONDITION, first, when NCCL_COMM_ID is set (above).
  static absl::StatusOr<std::unique_ptr<NcclCommunicatorFactory>> Create(const NcclCommunicatorOptions& options);

  // 128 bytes (ncclUniqueId); this process hosts the channel's bootstrap.
  absl::StatusOr<std::string> NewUniqueId() override;
  // INVALID_ARGUMENT unless `unique_id` is 128 bytes and `rank` 0 or 1;
  // INTERNAL when CUDA or NCCL cannot set the channel up.
  absl::StatusOr<std::unique_ptr<Communicator>> Join(absl::string_view unique_id, int rank) override;

 private:
  explicit NcclCommunicatorFactory(const NcclCommunicatorOptions& options) : options_(options) {}

  const NcclCommunicatorOptions options_;
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_NCCL_COMMUNICATOR_H_
