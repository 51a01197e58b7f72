#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "kernels/cuda/device_presence.h"
#include "transport/nccl_ops.h"

static_assert(sizeof(ncclUniqueId) == hybridserve::transport::nccl_ops::kUniqueIdBytes, "ncclUniqueId changed size");

namespace hybridserve::transport::nccl_ops {

struct Channel {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* staging = nullptr;  // [kChunkBytes] on `device`
  int device = 0;
  int peer = 0;
  bool ready = false;    // both ranks joined
  bool aborted = false;  // ncclCommAbort was called: every later call fails
};

namespace {

OpResult Result(Outcome outcome, std::string message) {
  OpResult r;
  r.outcome = outcome;
  r.message = std::move(message);
  return r;
}

OpResult CudaFailure(const char* call, cudaError_t e) {
  return Result(Outcome::kFailed, std::string(call) + ": " + cudaGetErrorString(e));
}

OpResult NcclFailure(const char* call, ncclResult_t r) {
  return Result(Outcome::kFailed, std::string(call) + ": " + ncclGetErrorString(r));
}

void AbortComm(Channel* c) {
  if (c->comm != nullptr && !c->aborted) ncclCommAbort(c->comm);
  c->aborted = true;
}

// Polls until the communicator has nothing in progress and, with
// `stream_too`, the stream is idle. Aborts the communicator on an error, at
// the deadline, or when the abort flag is raised.
OpResult Poll(Channel* c, const WaitParams& wait, bool stream_too) {
  // Short pauses while a transfer is likely in flight, longer ones once the
  // wait looks idle (a receiver waiting for its next transfer).
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(1);
  while (true) {
    ncclResult_t async = ncclSuccess;
    if (const ncclResult_t r = ncclCommGetAsyncError(c->comm, &async); r != ncclSuccess) {
      AbortComm(c);
      return NcclFailure("ncclCommGetAsyncError", r);
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      AbortComm(c);
      return Result(Outcome::kPeerFailed, std::string("NCCL communicator error: ") + ncclGetErrorString(async));
    }
    if (async == ncclSuccess) {
      if (!stream_too) return OpResult();
      const cudaError_t q = cudaStreamQuery(c->stream);
      if (q == cudaSuccess) return OpResult();
      if (q != cudaErrorNotReady) {
        AbortComm(c);
        return CudaFailure("cudaStreamQuery", q);
      }
    }
    if (wait.abort != nullptr && wait.abort->load()) {
      AbortComm(c);
      return Result(Outcome::kAborted, "the NCCL channel was aborted");
    }
    if (std::chrono::steady_clock::now() >= wait.deadline) {
      AbortComm(c);
      return Result(Outcome::kTimedOut, "the NCCL operation did not complete by its deadline");
    }
    std::this_thread::sleep_for(pause);
    const bool idle = std::chrono::steady_clock::now() - start > std::chrono::milliseconds(50);
    pause = std::min(pause * 2, std::chrono::microseconds(idle ? 2000 : 200));
  }
}

OpResult MakeCurrent(Channel* c) {
  if (c->aborted) return Result(Outcome::kAborted, "the NCCL channel was aborted");
  if (const cudaError_t e = cudaSetDevice(c->device); e != cudaSuccess) return CudaFailure("cudaSetDevice", e);
  return OpResult();
}

bool IsDevicePointer(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clear the error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

void FreeResources(Channel* c) {
  if (c->staging != nullptr) cudaFree(c->staging);
  if (c->stream != nullptr) cudaStreamDestroy(c->stream);
}

}  // namespace

int DeviceCount() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess) return count;
  cudaGetLastError();  // clear the sticky error
  return kernels::cuda::UsableDeviceCount(e, count, kernels::cuda::CudaDriverLoads());
}

OpResult NewUniqueId(std::string* out) {
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclFailure("ncclGetUniqueId", r);
  out->assign(id.internal, sizeof(id.internal));
  return OpResult();
}

OpResult Join(const std::string& unique_id, int rank, int device, Channel** out) {
  if (unique_id.size() != kUniqueIdBytes || (rank != 0 && rank != 1) || device < 0 || device >= DeviceCount()) {
    return Result(Outcome::kInvalid, "NCCL join: a unique id of " + std::to_string(unique_id.size()) + " bytes, rank " +
                                         std::to_string(rank) + ", device " + std::to_string(device));
  }
  auto* c = new Channel;
  c->device = device;
  c->peer = 1 - rank;
  OpResult r = MakeCurrent(c);
  if (r.ok()) {
    if (const cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking); e != cudaSuccess) {
      r = CudaFailure("cudaStreamCreateWithFlags", e);
    }
  }
  if (r.ok()) {
    if (const cudaError_t e = cudaMalloc(&c->staging, kChunkBytes); e != cudaSuccess) r = CudaFailure("cudaMalloc", e);
  }
  if (r.ok()) {
    ncclUniqueId id;
    std::memcpy(id.internal, unique_id.data(), kUniqueIdBytes);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init returns at once; WaitReady polls it, bounded
    const ncclResult_t nr = ncclCommInitRankConfig(&c->comm, 2, id, rank, &config);
    if (nr != ncclSuccess && nr != ncclInProgress) r = NcclFailure("ncclCommInitRankConfig", nr);
  }
  if (!r.ok()) {
    Destroy(c);
    return r;
  }
  *out = c;
  return OpResult();
}

OpResult WaitReady(Channel* c, const WaitParams& wait) {
  if (c->ready) return c->aborted ? Result(Outcome::kAborted, "the NCCL channel was aborted") : OpResult();
  OpResult r = MakeCurrent(c);
  if (r.ok()) r = Poll(c, wait, /*stream_too=*/false);
  c->ready = r.ok();
  return r;
}

OpResult Send(Channel* c, const void* data, size_t bytes, const WaitParams& wait) {
  OpResult r = WaitReady(c, wait);
  if (r.ok()) r = MakeCurrent(c);
  if (!r.ok()) return r;
  const bool on_device = IsDevicePointer(data);
  const char* src = static_cast<const char*>(data);
  for (size_t offset = 0; offset < bytes; offset += kChunkBytes) {
    const size_t n = std::min(kChunkBytes, bytes - offset);
    const void* chunk = src + offset;
    if (!on_device) {
      // The stream is idle here, so the copy from pageable memory is bounded.
      if (const cudaError_t e = cudaMemcpyAsync(c->staging, src + offset, n, cudaMemcpyHostToDevice, c->stream);
          e != cudaSuccess) {
        AbortComm(c);
        return CudaFailure("cudaMemcpyAsync (host to device)", e);
      }
      chunk = c->staging;
    }
    if (const ncclResult_t nr = ncclSend(chunk, n, ncclUint8, c->peer, c->comm, c->stream);
        nr != ncclSuccess && nr != ncclInProgress) {
      AbortComm(c);
      return NcclFailure("ncclSend", nr);
    }
    r = Poll(c, wait, /*stream_too=*/true);
    if (!r.ok()) return r;
  }
  return OpResult();
}

OpResult Recv(Channel* c, void* data, size_t bytes, const WaitParams& wait) {
  OpResult r = WaitReady(c, wait);
  if (r.ok()) r = MakeCurrent(c);
  if (!r.ok()) return r;
  const bool on_device = IsDevicePointer(data);
  char* dst = static_cast<char*>(data);
  for (size_t offset = 0; offset < bytes; offset += kChunkBytes) {
    const size_t n = std::min(kChunkBytes, bytes - offset);
    void* chunk = on_device ? static_cast<void*>(dst + offset) : c->staging;
    if (const ncclResult_t nr = ncclRecv(chunk, n, ncclUint8, c->peer, c->comm, c->stream);
        nr != ncclSuccess && nr != ncclInProgress) {
      AbortComm(c);
      return NcclFailure("ncclRecv", nr);
    }
    // Wait for the receive before copying out: a copy to pageable memory
    // blocks the host until it is done, with no deadline.
    r = Poll(c, wait, /*stream_too=*/true);
    if (!r.ok()) return r;
    if (!on_device) {
      if (const cudaError_t e = cudaMemcpyAsync(dst + offset, c->staging, n, cudaMemcpyDeviceToHost, c->stream);
          e != cudaSuccess) {
        AbortComm(c);
        return CudaFailure("cudaMemcpyAsync (device to host)", e);
      }
      r = Poll(c, wait, /*stream_too=*/true);
      if (!r.ok()) return r;
    }
  }
  return OpResult();
}

void Destroy(Channel* c) {
  if (c == nullptr) return;
  cudaSetDevice(c->device);
  AbortComm(c);
  FreeResources(c);
  delete c;
}

}  // namespace hybridserve::transport::nccl_ops
