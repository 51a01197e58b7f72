#ifndef HYBRIDSERVE_TRANSPORT_NCCL_OPS_H_
#define HYBRIDSERVE_TRANSPORT_NCCL_OPS_H_

// The NCCL and CUDA calls under NcclCommunicator (nccl_communicator.h),
// compiled by nvcc (nccl_ops.cu). Plain C++: no CUDA or NCCL types, no absl;
// C++ callers never include CUDA headers.
//
// A channel is a two-rank NCCL communicator initialized non-blocking, with
// its own stream and a device staging buffer of kChunkBytes. Every wait
// polls the stream and ncclCommGetAsyncError, and aborts the communicator
// (ncclCommAbort) at its deadline, when its abort flag is raised, or when
// NCCL reports an error (a peer gone): no call blocks past its deadline.
//
// A message of n bytes travels as ceil(n / kChunkBytes) ncclSend/ncclRecv
// pairs of at most kChunkBytes each, the same split on both ranks. Host
// memory is copied through the staging buffer; device memory is sent and
// received in place.
//
// Thread-compatible: one thread at a time per channel (any thread; each call
// sets the channel's device); `abort` may be raised from any thread.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>

namespace hybridserve::transport::nccl_ops {

inline constexpr size_t kUniqueIdBytes = 128;           // sizeof(ncclUniqueId)
inline constexpr size_t kChunkBytes = size_t{4} << 20;  // must be equal on both ranks: it is not negotiated

enum class Outcome {
  kOk,
  kTimedOut,    // the deadline passed; the communicator was aborted
  kAborted,     // the abort flag was raised; the communicator was aborted
  kPeerFailed,  // NCCL reported an asynchronous error (a peer gone, a network failure)
  kFailed,      // a CUDA or NCCL call failed
  kInvalid,     // a bad argument (unique id size, rank, device)
};

struct OpResult {
  Outcome outcome = Outcome::kOk;
  std::string message;  // the call that failed and the CUDA/NCCL error string
  bool ok() const { return outcome == Outcome::kOk; }
};

// When a wait gives up.
struct WaitParams {
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  const std::atomic<bool>* abort = nullptr;  // may be null
};

// Usable CUDA devices; 0 when there is no driver or no GPU; the negated
// cudaError_t on a machine whose CUDA setup is broken
// (kernels/cuda/device_presence.h).
int DeviceCount();

// A new ncclUniqueId as kUniqueIdBytes bytes in `*out`. This process hosts
// the bootstrap rendezvous until both ranks have joined.
OpResult NewUniqueId(std::string* out);

struct Channel;  // opaque; owned by the caller between Join and Destroy

// Starts joining channel `unique_id` (kUniqueIdBytes) as `rank` (0 or 1) on
// CUDA device `device`; returns at once with `*out` set on success.
OpResult Join(const std::string& unique_id, int rank, int device, Channel** out);
// Waits until both ranks have joined.
OpResult WaitReady(Channel* channel, const WaitParams& wait);
// Sends / receives one message of `bytes` bytes at `data` (host or device
// memory) to / from the other rank, waiting until it completed.
OpResult Send(Channel* channel, const void* data, size_t bytes, const WaitParams& wait);
OpResult Recv(Channel* channel, void* data, size_t bytes, const WaitParams& wait);
// Aborts the communicator (unless already aborted) and frees the channel.
void Destroy(Channel* channel);

}  // namespace hybridserve::transport::nccl_ops

#endif  // HYBRIDSERVE_TRANSPORT_NCCL_OPS_H_
