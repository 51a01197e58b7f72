#ifndef HYBRIDSERVE_KERNELS_PEER_MEMORY_H_
#define HYBRIDSERVE_KERNELS_PEER_MEMORY_H_

// Device memory shared with another process on the same device (CUDA IPC),
// and the copies a data-plane thread makes into and out of this process's
// device memory. A backend that can share memory hands one out
// (Backend::peer_memory(); null on backends that cannot, the CPU's); it lives
// as long as its backend.
//
// Thread safety: thread-safe. Every method may be called from any thread,
// concurrently with each other and with the owning backend's own calls
// (which stay one caller at a time). Copies run apart from the backend's
// kernels and copies (on a stream of their own) and have completed when they
// return: device memory they read holds what the backend's work wrote only
// after the caller has waited for that work (Backend::Synchronize), and
// memory they write must have no backend work issued and not waited for
// (Allocate's zero fill included), or that work may land after the copy and
// overwrite it. A buffer they touch must stay live meanwhile.
//
// Errors are KernelStatus codes (kernels/kernel_status.h), as everywhere in
// kernels/.

#include <cstdint>
#include <string>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

class PeerMemory {
 public:
  virtual ~PeerMemory() = default;

  // A handle naming the buffer that holds [device, device + bytes), and the
  // offset of `device` in it, for OpenPeerMemory in another process.
  // kKernelInvalidArgument for a range outside a live buffer of the backend
  // (host memory, say).
  virtual int ExportMemory(const void* device, int64_t bytes, std::string* handle, int64_t* offset) = 0;
  // Maps a handle ExportMemory made in another process: *base is the buffer's
  // first byte here, *bytes its size. CopyToPeer may write into [base, base +
  // bytes) until ClosePeerMemory(base) or the backend's destruction.
  virtual int OpenPeerMemory(const std::string& handle, void** base, int64_t* bytes) = 0;
  virtual int ClosePeerMemory(void* base) = 0;
  // Copies `bytes` from device memory of the backend or from host memory into
  // an opened peer buffer.
  virtual int CopyToPeer(void* peer_dst, const void* src, int64_t bytes) = 0;
  // Device memory of the backend (inside one live buffer) to the host, and
  // the host to device memory of the backend: the staging copies of a
  // transfer whose other end is host memory.
  virtual int CopyToHost(void* host_dst, const void* device_src, int64_t bytes) = 0;
  virtual int CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) = 0;
};

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_PEER_MEMORY_H_
