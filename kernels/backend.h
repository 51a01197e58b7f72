#ifndef HYBRIDSERVE_KERNELS_BACKEND_H_
#define HYBRIDSERVE_KERNELS_BACKEND_H_

// The backend interface: device memory and every kernel the engine runs, over
// the backend-neutral params structs of kernels/*_params.h. The CPU backend
// (kernels/cpu/cpu_backend.h) implements it on host memory; a CUDA backend
// implements it on device memory. The engine sees kernels only through this
// class (docs/ARCHITECTURE.md section 1), so the same engine code runs on either.
//
// Memory model. Every pointer in a params struct passed to a kernel is device
// memory of the backend that runs it: inside a DeviceBuffer this backend
// allocated or uploaded (index arrays such as block tables and state slots
// included). The host reads and writes device memory only through the copy
// calls below, or through HostAddress() where the backend allows it, so code
// written against this interface is correct on a device whose memory the host
// cannot address.
//
// Ordering. Kernels and copies issued by one thread run in issue order. A copy
// to the host has completed when it returns; a copy from the host may still be
// in flight, but the source may be reused as soon as the call returns.
// Synchronize() waits for everything issued.
//
// Errors. Every call returns a KernelStatus (kernels/kernel_status.h): bad
// arguments are kKernelInvalidArgument and change nothing; an allocation that
// does not fit is kKernelOutOfMemory. Kernels never throw, log or abort.
//
// Thread safety: a backend is used by one thread at a time (the engine
// serializes its calls); DeviceBuffer handles may be destroyed from that same
// thread only. What other threads may do (the data plane sharing device memory
// with another process) goes through peer_memory(), which is thread-safe.

#include <cstdint>

#include "kernels/activation_params.h"
#include "kernels/attention_params.h"
#include "kernels/conv1d_params.h"
#include "kernels/embedding_params.h"
#include "kernels/gated_delta_params.h"
#include "kernels/kernel_status.h"
#include "kernels/matmul_params.h"
#include "kernels/moe_params.h"
#include "kernels/norm_params.h"
#include "kernels/peer_memory.h"
#include "kernels/rows_params.h"
#include "kernels/ssd_params.h"

namespace hybridserve::kernels {

class Backend;

// A block of device memory owned by one backend (or, for UploadConstant on a
// backend whose device is the host, a view of host memory that outlives it).
// Move-only; releases its memory when destroyed. Must not outlive its backend.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = static_cast<DeviceBuffer&&>(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  // Device address of the first byte (null for an empty buffer).
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }
  Backend* backend() const { return backend_; }

  // Releases the memory now; the buffer becomes empty.
  void Reset();

 private:
  friend class Backend;
  DeviceBuffer(Backend* backend, void* data, int64_t bytes, void* cookie)
      : backend_(backend), data_(data), bytes_(bytes), cookie_(cookie) {}

  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  void* cookie_ = nullptr;  // the backend's own handle (e.g. the allocation to free)
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda", ...: for messages and metrics.
  virtual const char* name() const = 0;
  // Which code path the kernels take on this machine ("avx512_bf16", "sm_90",
  // ...; empty when there is only one): logged at start, printed by benchmarks.
  virtual const char* variant() const { return ""; }

  // ---- Memory ----

  // `bytes` (>= 1) of device memory, zero-filled, aligned to 64 bytes.
  virtual int Allocate(int64_t bytes, DeviceBuffer* out) = 0;
  // Device memory holding host[0, bytes), read-only for kernels. The host
  // bytes must stay unchanged until the buffer is released: a backend whose
  // device is the host may alias them instead of copying (the CPU backend
  // does, so model weights are not held twice).
  virtual int UploadConstant(const void* host, int64_t bytes, DeviceBuffer* out) = 0;
  // Host -> device, device -> host, device -> device, and a byte fill of
  // device memory. Ranges must lie inside buffers of this backend and must not
  // overlap.
  virtual int CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) = 0;
  virtual int CopyToHost(void* host_dst, const void* device_src, int64_t bytes) = 0;
  virtual int CopyOnDevice(void* device_dst, const void* device_src, int64_t bytes) = 0;
  virtual int Fill(void* device_dst, uint8_t value, int64_t bytes) = 0;
  // A host address for device memory that the host may read and write
  // directly (zero-copy views), or null when the host cannot address it; the
  // caller then copies. Valid while the buffer lives, after Synchronize().
  virtual void* HostAddress(void* device) = 0;
  // Waits for every kernel and copy issued so far.
  virtual int Synchronize() = 0;

  // ---- Kernels (the params structs document shapes and semantics) ----

  virtual int Embedding(const EmbeddingParams& p) = 0;
  virtual int Matmul(const MatmulParams& p, MatmulMode mode) = 0;
  // items[0, count) as independent matmuls issued in one call (a MoE block's
  // experts): item i's out gets exactly the bits Matmul(items[i], mode) gives.
  // `items` is host memory (the list of launches; the pointers in it are
  // device memory). No item's out may overlap another item's out or any
  // item's inputs. Every item is checked first; on a bad one nothing runs.
  // The default issues the items one by one; a backend may run them together
  // (the CPU backend runs its small items, decode's, in one parallel region:
  // one long stream over all their weights instead of a pool barrier each).
  virtual int MatmulBatch(const MatmulParams* items, int64_t count, MatmulMode mode);
  virtual int RmsNorm(const RmsNormParams& p) = 0;
  virtual int GatedRmsNorm(const GatedRmsNormParams& p) = 0;
  virtual int Activation(const ActivationParams& p) = 0;
  virtual int SwiGlu(const SwiGluParams& p) = 0;
  virtual int DtSoftplus(const DtSoftplusParams& p) = 0;
  virtual int CausalConv1d(const CausalConv1dParams& p) = 0;
  virtual int CausalConv1dUpdate(const CausalConv1dUpdateParams& p) = 0;
  virtual int SsdChunkScan(const SsdChunkScanParams& p) = 0;
  virtual int SelectiveStateUpdate(const SelectiveStateUpdateParams& p) = 0;
  // Gated DeltaNet (kernels/gated_delta_params.h): the gates g and beta, the
  // chunked prefill on the absolute chunk grid, and the one-token decode step.
  virtual int GatedDeltaGates(const GatedDeltaGatesParams& p) = 0;
  virtual int GatedDeltaPrefill(const GatedDeltaParams& p) = 0;
  virtual int GatedDeltaDecode(const GatedDeltaDecodeParams& p) = 0;
  virtual int KvAppend(const KvAppendParams& p) = 0;
  virtual int KvAppendDecode(const KvAppendDecodeParams& p) = 0;
  virtual int AttentionPrefill(const AttentionPrefillParams& p) = 0;
  virtual int AttentionDecode(const AttentionDecodeParams& p) = 0;
  virtual int Rope(const RopeParams& p) = 0;
  virtual int GatherRows(const GatherRowsParams& p) = 0;
  virtual int ScatterAddRows(const ScatterAddRowsParams& p) = 0;
  // A mixture-of-experts block on the device (kernels/moe_params.h): routing,
  // the experts' projections over the rows the routing grouped, and the
  // weighted combine. ExpertMatmul also runs `also` [0, also_count) (host
  // memory: independent matmuls such as the shared expert's, each with the
  // bits of its own Matmul) in the same call; on a bad item nothing runs.
  virtual int MoeRoute(const MoeRouteParams& p) = 0;
  virtual int ExpertMatmul(const ExpertMatmulParams& p, const MatmulParams* also, int64_t also_count,
                           MatmulMode mode) = 0;
  virtual int MoeCombine(const MoeCombineParams& p) = 0;

  // ---- Graphs (optional: the CPU backend has none) ----
  //
  // Between BeginCapture() and EndCapture(), kernels, CopyOnDevice and Fill
  // are recorded instead of run; Replay(graph) runs the recording again in
  // issue order, with the arguments it was recorded with (pointers and sizes:
  // the bytes behind them are read at replay). Kernel arguments are checked
  // as they are recorded. While capturing, Allocate, UploadConstant, copies to
  // or from the host and Synchronize return kKernelInvalidArgument and spoil
  // the capture: EndCapture then fails and discards it. A graph lives until
  // ReleaseGraph() or the backend's destruction; the buffers it names must
  // outlive its replays.
  virtual bool supports_graphs() const { return false; }
  virtual int BeginCapture() { return kKernelUnsupported; }
  // The new graph's id (>= 0) in *graph.
  virtual int EndCapture(int64_t* graph) { return kKernelUnsupported; }
  virtual int Replay(int64_t graph) { return kKernelUnsupported; }
  virtual int ReleaseGraph(int64_t graph) { return kKernelUnsupported; }

  // ---- Memory shared with another process on the same device (optional: CUDA IPC) ----
  //
  // The thread-safe sharing calls of this backend (kernels/peer_memory.h),
  // owned by it; null on backends without shared memory (the CPU backend).
  virtual PeerMemory* peer_memory() { return nullptr; }

 protected:
  // For implementations: a buffer of this backend over `data`, handed back to
  // Release(data, bytes, cookie) when it is destroyed.
  DeviceBuffer MakeBuffer(void* data, int64_t bytes, void* cookie) { return DeviceBuffer(this, data, bytes, cookie); }
  // Frees what MakeBuffer wrapped.
  virtual void Release(void* data, int64_t bytes, void* cookie) = 0;

 private:
  friend class DeviceBuffer;
};

inline int Backend::MatmulBatch(const MatmulParams* items, int64_t count, MatmulMode mode) {
  if (count < 0 || (count > 0 && items == nullptr)) return kKernelInvalidArgument;
  for (int64_t i = 0; i < count; ++i) {
    if (const KernelStatus status = CheckMatmulParams(items[i]); status != kKernelOk) return status;
  }
  for (int64_t i = 0; i < count; ++i) {
    if (const int status = Matmul(items[i], mode); status != kKernelOk) return status;
  }
  return kKernelOk;
}

inline DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    backend_ = other.backend_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    cookie_ = other.cookie_;
    other.backend_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
    other.cookie_ = nullptr;
  }
  return *this;
}

inline void DeviceBuffer::Reset() {
  if (backend_ != nullptr && data_ != nullptr) backend_->Release(data_, bytes_, cookie_);
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
  cookie_ = nullptr;
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_BACKEND_H_
