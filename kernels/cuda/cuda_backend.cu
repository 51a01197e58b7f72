// kernels::Backend on a CUDA device (kernels/cuda/cuda_backend.h). Built by
// nvcc (namespace kernels::cuda) and, for tests without a GPU, by the host
// compiler against the CUDA emulator (namespace kernels::cuda_emu).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/cuda/device_common.cuh"

#if defined(__CUDACC__)
#include <cublas_v2.h>
#endif

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_presence.h"
#include "kernels/cuda/launchers.h"

namespace hybridserve::kernels::HS_CUDA_NS {
namespace {

std::string ErrorText(const char* what, cudaError_t error) {
  return std::string(what) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
}

// The live allocations of one backend: start address -> bytes. Thread-safe
// (the backend adds and removes, its peer memory looks up from other threads).
class LiveBuffers {
 public:
  void Add(const void* base, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_[reinterpret_cast<uintptr_t>(base)] = bytes;
  }
  void Remove(const void* base) {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.erase(reinterpret_cast<uintptr_t>(base));
  }
  // Whether [p, p + bytes) lies inside one live buffer; if so, that buffer's
  // start and size in *base and *size (each may be null).
  bool Find(const void* p, int64_t bytes, uintptr_t* base = nullptr, int64_t* size = nullptr) const {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buffers_.upper_bound(addr);
    if (it == buffers_.begin()) return false;
    --it;
    if (addr < it->first || addr - it->first + static_cast<uint64_t>(bytes) > static_cast<uint64_t>(it->second)) {
      return false;
    }
    if (base != nullptr) *base = it->first;
    if (size != nullptr) *size = it->second;
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, int64_t> buffers_;  // guarded by mu_
};

// kernels::PeerMemory over CUDA IPC, for the buffers of one CudaBackend.
// Thread-safe: mu_ guards peers_ and serializes the copies, which run on a
// stream of their own (stream_, owned) and are waited for before returning.
class CudaPeerMemory final : public PeerMemory {
 public:
  // `buffers` (the backend's) outlives this object.
  CudaPeerMemory(int device, const LiveBuffers& buffers, cudaStream_t stream)
      : device_(device), buffers_(buffers), stream_(stream) {}
  ~CudaPeerMemory() override;

  int ExportMemory(const void* device, int64_t bytes, std::string* handle, int64_t* offset) override;
  int OpenPeerMemory(const std::string& handle, void** base, int64_t* bytes) override;
  int ClosePeerMemory(void* base) override;
  int CopyToPeer(void* peer_dst, const void* src, int64_t bytes) override;
  int CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  int CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;

 private:
  // See CudaBackend::UseDevice: the calling thread may be new to CUDA.
  void UseDevice() const { cudaSetDevice(device_); }
  // cudaMemcpyDefault on stream_, waited for; call with mu_ held.
  int CopyAndWait(void* dst, const void* src, int64_t bytes);

  const int device_;
  const LiveBuffers& buffers_;
  std::mutex mu_;
  std::map<uintptr_t, int64_t> peers_;  // opened here: base -> bytes; guarded by mu_
  cudaStream_t stream_ = nullptr;       // used under mu_
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() = default;
  ~CudaBackend() override;

  // Everything that can fail at creation; *error says what did.
  bool Init(const CudaBackendOptions& options, std::string* error);

  const char* name() const override { return "cuda"; }
  const char* variant() const override { return variant_.c_str(); }

  int Allocate(int64_t bytes, DeviceBuffer* out) override;
  int UploadConstant(const void* host, int64_t bytes, DeviceBuffer* out) override;
  int CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;
  int CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  int CopyOnDevice(void* device_dst, const void* device_src, int64_t bytes) override;
  int Fill(void* device_dst, uint8_t value, int64_t bytes) override;
  void* HostAddress(void*) override { return nullptr; }
  int Synchronize() override;

  int Embedding(const EmbeddingParams& p) override {
    UseDevice();
    return HS_CUDA_NS::Embedding(p, ctx_);
  }
  int Matmul(const MatmulParams& p, MatmulMode mode) override {
    UseDevice();
    return HS_CUDA_NS::Matmul(p, mode, ctx_);
  }
  int RmsNorm(const RmsNormParams& p) override {
    UseDevice();
    return HS_CUDA_NS::RmsNorm(p, ctx_);
  }
  int GatedRmsNorm(const GatedRmsNormParams& p) override {
    UseDevice();
    return HS_CUDA_NS::GatedRmsNorm(p, ctx_);
  }
  int Activation(const ActivationParams& p) override {
    UseDevice();
    return HS_CUDA_NS::Activation(p, ctx_);
  }
  int SwiGlu(const SwiGluParams& p) override {
    UseDevice();
    return HS_CUDA_NS::SwiGlu(p, ctx_);
  }
  int DtSoftplus(const DtSoftplusParams& p) override {
    UseDevice();
    return HS_CUDA_NS::DtSoftplus(p, ctx_);
  }
  int CausalConv1d(const CausalConv1dParams& p) override {
    UseDevice();
    return HS_CUDA_NS::CausalConv1d(p, ctx_);
  }
  int CausalConv1dUpdate(const CausalConv1dUpdateParams& p) override {
    UseDevice();
    return HS_CUDA_NS::CausalConv1dUpdate(p, ctx_);
  }
  int SsdChunkScan(const SsdChunkScanParams& p) override {
    UseDevice();
    return HS_CUDA_NS::SsdChunkScan(p, ctx_);
  }
  int SelectiveStateUpdate(const SelectiveStateUpdateParams& p) override {
    UseDevice();
    return HS_CUDA_NS::SelectiveStateUpdate(p, ctx_);
  }
  int GatedDeltaGates(const GatedDeltaGatesParams& p) override {
    UseDevice();
    return HS_CUDA_NS::GatedDeltaGates(p, ctx_);
  }
  int GatedDeltaPrefill(const GatedDeltaParams& p) override {
    UseDevice();
    return HS_CUDA_NS::GatedDeltaPrefill(p, ctx_);
  }
  int GatedDeltaDecode(const GatedDeltaDecodeParams& p) override {
    UseDevice();
    return HS_CUDA_NS::GatedDeltaDecode(p, ctx_);
  }
  int KvAppend(const KvAppendParams& p) override {
    UseDevice();
    return HS_CUDA_NS::KvAppend(p, ctx_);
  }
  int KvAppendDecode(const KvAppendDecodeParams& p) override {
    UseDevice();
    return HS_CUDA_NS::KvAppendDecode(p, ctx_);
  }
  int AttentionPrefill(const AttentionPrefillParams& p) override {
    UseDevice();
    return HS_CUDA_NS::AttentionPrefill(p, ctx_);
  }
  int AttentionDecode(const AttentionDecodeParams& p) override {
    UseDevice();
    return HS_CUDA_NS::AttentionDecode(p, ctx_);
  }
  int Rope(const RopeParams& p) override {
    UseDevice();
    return HS_CUDA_NS::Rope(p, ctx_);
  }
  int GatherRows(const GatherRowsParams& p) override {
    UseDevice();
    return HS_CUDA_NS::GatherRows(p, ctx_);
  }
  int ScatterAddRows(const ScatterAddRowsParams& p) override {
    UseDevice();
    return HS_CUDA_NS::ScatterAddRows(p, ctx_);
  }
  int MoeRoute(const MoeRouteParams& p) override {
    UseDevice();
    return HS_CUDA_NS::MoeRoute(p, ctx_);
  }
  int ExpertMatmul(const ExpertMatmulParams& p, const MatmulParams* also, int64_t also_count,
                   MatmulMode mode) override {
    if (const int status = CheckExpertMatmulParams(p); status != kKernelOk) return status;
    if (also_count < 0 || (also_count > 0 && also == nullptr)) return kKernelInvalidArgument;
    for (int64_t i = 0; i < also_count; ++i) {
      if (const int status = CheckMatmulParams(also[i]); status != kKernelOk) return status;
    }
    UseDevice();
    if (const int status = HS_CUDA_NS::ExpertMatmul(p, ctx_); status != kKernelOk) return status;
    for (int64_t i = 0; i < also_count; ++i) {
      if (const int status = HS_CUDA_NS::Matmul(also[i], mode, ctx_); status != kKernelOk) return status;
    }
    return kKernelOk;
  }
  int MoeCombine(const MoeCombineParams& p) override {
    UseDevice();
    return HS_CUDA_NS::MoeCombine(p, ctx_);
  }

  PeerMemory* peer_memory() override { return peer_memory_.get(); }

  bool supports_graphs() const override { return true; }
  int BeginCapture() override;
  int EndCapture(int64_t* graph) override;
  int Replay(int64_t graph) override;
  int ReleaseGraph(int64_t graph) override;

 protected:
  void Release(void* data, int64_t bytes, void* cookie) override;

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(ctx_.stream); }
  // Makes device_ the calling host thread's current device. CUDA's current
  // device is per host thread, and the backend is called from threads other
  // than the one that created it (the engine's, the data plane's): without
  // this, with device_index > 0, their allocations and IPC mappings would land
  // on device 0 and their launches into stream() (device_'s) would fail.
  void UseDevice() const { cudaSetDevice(device_); }
  // Whether [p, p + bytes) lies inside one live buffer of this backend.
  bool InsideBuffer(const void* p, int64_t bytes) const { return buffers_.Find(p, bytes); }
  // Waits for the stream, then reports (and clears) a kernel's out-of-range
  // index flag: kKernelOk, kKernelInvalidArgument or kKernelDeviceError.
  int WaitAndCheck();
  // While capturing: spoils the capture (an operation a graph cannot hold) and
  // returns true.
  bool RefuseWhileCapturing();

  int device_ = 0;
  std::string variant_;
  CudaLaunchContext ctx_;
  int32_t* host_flag_ = nullptr;  // pinned mirror of ctx_.error_flag
  LiveBuffers buffers_;
  void* blas_workspace_ = nullptr;  // cuBLAS's own, so it never allocates while a graph is captured
  bool capturing_ = false;
  bool capture_spoiled_ = false;
  int64_t next_graph_ = 0;
  std::map<int64_t, cudaGraphExec_t> graphs_;
  // The sharing calls, made from data-plane threads.
  std::unique_ptr<CudaPeerMemory> peer_memory_;
};

// Cookie of a buffer this backend allocated (Release frees it).
char kDeviceCookie;

CudaBackend::~CudaBackend() {
  UseDevice();
  if (capturing_) {
    cudaGraph_t abandoned = nullptr;
    if (cudaStreamEndCapture(stream(), &abandoned) == cudaSuccess && abandoned != nullptr) cudaGraphDestroy(abandoned);
  }
  if (ctx_.stream != nullptr) cudaStreamSynchronize(stream());
  for (auto& [id, exec] : graphs_) cudaGraphExecDestroy(exec);
  peer_memory_.reset();
  if (blas_workspace_ != nullptr) cudaFree(blas_workspace_);
#if defined(__CUDACC__)
  if (ctx_.blas != nullptr) cublasDestroy(static_cast<cublasHandle_t>(ctx_.blas));
#endif
  if (ctx_.workspace != nullptr) cudaFree(ctx_.workspace);
  if (ctx_.error_flag != nullptr) cudaFree(ctx_.error_flag);
  if (host_flag_ != nullptr) cudaFreeHost(host_flag_);
  if (ctx_.stream != nullptr) cudaStreamDestroy(stream());
}

bool CudaBackend::Init(const CudaBackendOptions& options, std::string* error) {
  const int count = CudaDeviceCount();
  if (count == 0) {
    *error = cuda::CudaDriverLoads() ? "no CUDA device on this machine (no GPU)"
                                     : "no CUDA device on this machine (no CUDA driver: libcuda.so.1 does not load)";
    return false;
  }
  if (count < 0) {
    *error = ErrorText("cudaGetDeviceCount", static_cast<cudaError_t>(-count)) +
             ": a machine with a CUDA driver whose CUDA setup is broken";
    return false;
  }
  cudaError_t e;
  if (options.device_index < 0 || options.device_index >= count) {
    *error = "CUDA device " + std::to_string(options.device_index) + " does not exist (this machine has " +
             std::to_string(count) + ")";
    return false;
  }
  if (options.workspace_bytes < (int64_t{1} << 20)) {
    *error = "workspace_bytes " + std::to_string(options.workspace_bytes) + " < 1 MiB";
    return false;
  }
  device_ = options.device_index;
  if ((e = cudaSetDevice(device_)) != cudaSuccess) return *error = ErrorText("cudaSetDevice", e), false;
  cudaDeviceProp prop;
  if ((e = cudaGetDeviceProperties(&prop, device_)) != cudaSuccess) {
    return *error = ErrorText("cudaGetDeviceProperties", e), false;
  }
  variant_ = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + " (" + prop.name + ")";
#if HS_CUDA_EMULATED
  variant_ += " emulated";
#endif
  cudaStream_t s = nullptr;
  if ((e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess) {
    return *error = ErrorText("cudaStreamCreateWithFlags", e), false;
  }
  ctx_.stream = s;
  cudaStream_t peer_stream = nullptr;
  if ((e = cudaStreamCreateWithFlags(&peer_stream, cudaStreamNonBlocking)) != cudaSuccess) {
    return *error = ErrorText("cudaStreamCreateWithFlags(peer)", e), false;
  }
  peer_memory_ = std::make_unique<CudaPeerMemory>(device_, buffers_, peer_stream);
  void* p = nullptr;
  if ((e = cudaMalloc(&p, sizeof(int32_t))) != cudaSuccess) return *error = ErrorText("cudaMalloc(flag)", e), false;
  ctx_.error_flag = static_cast<int32_t*>(p);
  if ((e = cudaMemsetAsync(p, 0, sizeof(int32_t), s)) != cudaSuccess) {
    return *error = ErrorText("cudaMemsetAsync(flag)", e), false;
  }
  if ((e = cudaMallocHost(&p, sizeof(int32_t))) != cudaSuccess) {
    return *error = ErrorText("cudaMallocHost(flag)", e), false;
  }
  host_flag_ = static_cast<int32_t*>(p);
  if ((e = cudaMalloc(&p, static_cast<size_t>(options.workspace_bytes))) != cudaSuccess) {
    cudaGetLastError();
    return *error = ErrorText("cudaMalloc(workspace)", e), false;
  }
  ctx_.workspace = p;
  ctx_.workspace_bytes = options.workspace_bytes;
#if defined(__CUDACC__)
  if (options.use_cublas) {
    cublasHandle_t handle = nullptr;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return *error = "cublasCreate failed", false;
    ctx_.blas = handle;
    // Plain fp32 for fp32 weights (no TF32); bf16 weights use bf16 tensor cores
    // through cublasGemmEx's types, not through the math mode.
    // cuBLAS gets a workspace of its own, so that it never allocates while a
    // decode graph is being captured (cuBLAS's rule for stream capture).
    constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;
    if ((e = cudaMalloc(&blas_workspace_, kBlasWorkspaceBytes)) != cudaSuccess) {
      return *error = ErrorText("cudaMalloc(cublas workspace)", e), false;
    }
    if (cublasSetStream(handle, s) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(handle, blas_workspace_, kBlasWorkspaceBytes) != CUBLAS_STATUS_SUCCESS) {
      return *error = "cublasSetStream / cublasSetMathMode / cublasSetWorkspace failed", false;
    }
  }
#endif
  if ((e = cudaStreamSynchronize(s)) != cudaSuccess) return *error = ErrorText("cudaStreamSynchronize", e), false;
  return true;
}

int CudaBackend::Allocate(int64_t bytes, DeviceBuffer* out) {
  UseDevice();
  if (out == nullptr || bytes < 1 || RefuseWhileCapturing()) return kKernelInvalidArgument;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (e != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it
    return e == cudaErrorMemoryAllocation ? kKernelOutOfMemory : kKernelDeviceError;
  }
  if (cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream()) != cudaSuccess) {
    cudaFree(p);
    return kKernelDeviceError;
  }
  buffers_.Add(p, bytes);
  *out = MakeBuffer(p, bytes, &kDeviceCookie);
  return kKernelOk;
}

int CudaBackend::UploadConstant(const void* host, int64_t bytes, DeviceBuffer* out) {
  if (out == nullptr || host == nullptr || bytes < 1 || RefuseWhileCapturing()) return kKernelInvalidArgument;
  DeviceBuffer buffer;
  if (const int status = Allocate(bytes, &buffer); status != kKernelOk) return status;
  if (const int status = CopyToDevice(buffer.data(), host, bytes); status != kKernelOk) return status;
  // The host bytes may be released as soon as this returns.
  if (cudaStreamSynchronize(stream()) != cudaSuccess) return kKernelDeviceError;
  *out = std::move(buffer);
  return kKernelOk;
}

void CudaBackend::Release(void* data, int64_t, void* cookie) {
  if (cookie != &kDeviceCookie) return;
  UseDevice();
  // Kernels already issued may still read the buffer; cudaFree waits for the
  // device, so freeing here is safe (and rare: buffers live as long as a model).
  buffers_.Remove(data);
  cudaFree(data);
}

int CudaBackend::CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
  UseDevice();
  if (RefuseWhileCapturing()) return kKernelInvalidArgument;
  if (bytes < 0 || (bytes > 0 && (device_dst == nullptr || host_src == nullptr))) return kKernelInvalidArgument;
  if (bytes == 0) return kKernelOk;
  if (!InsideBuffer(device_dst, bytes)) return kKernelInvalidArgument;
  // From pageable memory the call returns once the source has been staged, so
  // the caller may reuse it (the contract of Backend::CopyToDevice).
  return cudaMemcpyAsync(device_dst, host_src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream()) ==
                 cudaSuccess
             ? kKernelOk
             : kKernelDeviceError;
}

int CudaBackend::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  UseDevice();
  if (RefuseWhileCapturing()) return kKernelInvalidArgument;
  if (bytes < 0 || (bytes > 0 && (host_dst == nullptr || device_src == nullptr))) return kKernelInvalidArgument;
  if (bytes > 0 && !InsideBuffer(device_src, bytes)) return kKernelInvalidArgument;
  if (bytes > 0 && cudaMemcpyAsync(host_dst, device_src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                   stream()) != cudaSuccess) {
    return kKernelDeviceError;
  }
  return WaitAndCheck();
}

int CudaBackend::CopyOnDevice(void* device_dst, const void* device_src, int64_t bytes) {
  UseDevice();
  if (bytes < 0 || (bytes > 0 && (device_dst == nullptr || device_src == nullptr))) return kKernelInvalidArgument;
  if (bytes == 0) return kKernelOk;
  if (!InsideBuffer(device_dst, bytes) || !InsideBuffer(device_src, bytes)) return kKernelInvalidArgument;
  const auto d = reinterpret_cast<uintptr_t>(device_dst);
  const auto s = reinterpret_cast<uintptr_t>(device_src);
  if (d < s + static_cast<uint64_t>(bytes) && s < d + static_cast<uint64_t>(bytes)) return kKernelInvalidArgument;
  return cudaMemcpyAsync(device_dst, device_src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream()) ==
                 cudaSuccess
             ? kKernelOk
             : kKernelDeviceError;
}

int CudaBackend::Fill(void* device_dst, uint8_t value, int64_t bytes) {
  UseDevice();
  if (bytes < 0 || (bytes > 0 && device_dst == nullptr)) return kKernelInvalidArgument;
  if (bytes == 0) return kKernelOk;
  if (!InsideBuffer(device_dst, bytes)) return kKernelInvalidArgument;
  return cudaMemsetAsync(device_dst, value, static_cast<size_t>(bytes), stream()) == cudaSuccess ? kKernelOk
                                                                                                 : kKernelDeviceError;
}

CudaPeerMemory::~CudaPeerMemory() {
  UseDevice();
  for (auto& [base, bytes] : peers_) cudaIpcCloseMemHandle(reinterpret_cast<void*>(base));
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

// A handle is the CUDA IPC handle of the buffer followed by its size (8 bytes).
int CudaPeerMemory::ExportMemory(const void* device, int64_t bytes, std::string* handle, int64_t* offset) {
  UseDevice();
  uintptr_t base = 0;
  int64_t size = 0;
  if (handle == nullptr || offset == nullptr || device == nullptr || bytes < 1 ||
      !buffers_.Find(device, bytes, &base, &size)) {
    return kKernelInvalidArgument;
  }
  cudaIpcMemHandle_t h;
  if (cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)) != cudaSuccess) {
    cudaGetLastError();
    return kKernelDeviceError;
  }
  handle->assign(reinterpret_cast<const char*>(&h), sizeof(h));
  handle->append(reinterpret_cast<const char*>(&size), sizeof(int64_t));
  *offset = static_cast<int64_t>(reinterpret_cast<uintptr_t>(device) - base);
  return kKernelOk;
}

int CudaPeerMemory::OpenPeerMemory(const std::string& handle, void** base, int64_t* bytes) {
  UseDevice();
  if (base == nullptr || bytes == nullptr || handle.size() != sizeof(cudaIpcMemHandle_t) + sizeof(int64_t)) {
    return kKernelInvalidArgument;
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  int64_t size = 0;
  std::memcpy(&size, handle.data() + sizeof(h), sizeof(size));
  void* p = nullptr;
  if (size < 1 || cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
    cudaGetLastError();
    return kKernelInvalidArgument;
  }
  std::lock_guard<std::mutex> lock(mu_);
  peers_[reinterpret_cast<uintptr_t>(p)] = size;
  *base = p;
  *bytes = size;
  return kKernelOk;
}

int CudaPeerMemory::ClosePeerMemory(void* base) {
  UseDevice();
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = peers_.find(reinterpret_cast<uintptr_t>(base));
  if (it == peers_.end()) return kKernelInvalidArgument;
  peers_.erase(it);
  return cudaIpcCloseMemHandle(base) == cudaSuccess ? kKernelOk : kKernelDeviceError;
}

int CudaPeerMemory::CopyToPeer(void* peer_dst, const void* src, int64_t bytes) {
  UseDevice();
  if (bytes < 0 || (bytes > 0 && (peer_dst == nullptr || src == nullptr))) return kKernelInvalidArgument;
  if (bytes == 0) return kKernelOk;
  std::lock_guard<std::mutex> lock(mu_);
  const auto d = reinterpret_cast<uintptr_t>(peer_dst);
  auto it = peers_.upper_bound(d);
  if (it == peers_.begin()) return kKernelInvalidArgument;
  --it;
  if (d - it->first + static_cast<uint64_t>(bytes) > static_cast<uint64_t>(it->second)) return kKernelInvalidArgument;
  // Unified addressing tells device from host sources.
  return CopyAndWait(peer_dst, src, bytes);
}

int CudaPeerMemory::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  UseDevice();
  if (bytes < 0 || (bytes > 0 && (host_dst == nullptr || device_src == nullptr))) return kKernelInvalidArgument;
  if (bytes == 0) return kKernelOk;
  if (!buffers_.Find(device_src, bytes)) return kKernelInvalidArgument;
  std::lock_guard<std::mutex> lock(mu_);
  return CopyAndWait(host_dst, device_src, bytes);
}

int CudaPeerMemory::CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
  UseDevice();
  if (bytes < 0 || (bytes > 0 && (device_dst == nullptr || host_src == nullptr))) return kKernelInvalidArgument;
  if (bytes == 0) return kKernelOk;
  if (!buffers_.Find(device_dst, bytes)) return kKernelInvalidArgument;
  std::lock_guard<std::mutex> lock(mu_);
  return CopyAndWait(device_dst, host_src, bytes);
}

int CudaPeerMemory::CopyAndWait(void* dst, const void* src, int64_t bytes) {
  if (cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, stream_) != cudaSuccess ||
      cudaStreamSynchronize(stream_) != cudaSuccess) {
    return kKernelDeviceError;
  }
  return kKernelOk;
}

int CudaBackend::Synchronize() { return RefuseWhileCapturing() ? kKernelInvalidArgument : WaitAndCheck(); }

bool CudaBackend::RefuseWhileCapturing() {
  if (capturing_) capture_spoiled_ = true;
  return capturing_;
}

int CudaBackend::BeginCapture() {
  UseDevice();
  if (capturing_) return kKernelInvalidArgument;
  // Thread-local mode: other host threads' CUDA calls (another backend on the
  // same GPU) neither join nor spoil this capture.
  if (cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal) != cudaSuccess) return kKernelDeviceError;
  capturing_ = true;
  capture_spoiled_ = false;
  return kKernelOk;
}

int CudaBackend::EndCapture(int64_t* graph) {
  UseDevice();
  if (!capturing_) return kKernelInvalidArgument;
  capturing_ = false;
  cudaGraph_t recorded = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream(), &recorded);
  cudaGetLastError();  // a failed launch inside the capture also failed its own call
  if (ended != cudaSuccess || recorded == nullptr || capture_spoiled_ || graph == nullptr) {
    if (recorded != nullptr) cudaGraphDestroy(recorded);
    return ended != cudaSuccess ? kKernelDeviceError : kKernelInvalidArgument;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, recorded, 0);
  cudaGraphDestroy(recorded);
  if (made != cudaSuccess) return kKernelDeviceError;
  *graph = next_graph_++;
  graphs_[*graph] = exec;
  return kKernelOk;
}

int CudaBackend::Replay(int64_t graph) {
  UseDevice();
  if (capturing_) return kKernelInvalidArgument;
  const auto it = graphs_.find(graph);
  if (it == graphs_.end()) return kKernelInvalidArgument;
  return cudaGraphLaunch(it->second, stream()) == cudaSuccess ? kKernelOk : kKernelDeviceError;
}

int CudaBackend::ReleaseGraph(int64_t graph) {
  UseDevice();
  const auto it = graphs_.find(graph);
  if (it == graphs_.end()) return kKernelInvalidArgument;
  cudaGraphExecDestroy(it->second);
  graphs_.erase(it);
  return kKernelOk;
}

int CudaBackend::WaitAndCheck() {
  UseDevice();
  if (cudaMemcpyAsync(host_flag_, ctx_.error_flag, sizeof(int32_t), cudaMemcpyDeviceToHost, stream()) != cudaSuccess ||
      cudaStreamSynchronize(stream()) != cudaSuccess) {
    return kKernelDeviceError;
  }
  if (*host_flag_ == kKernelOk) return kKernelOk;
  const int flagged = *host_flag_;
  *host_flag_ = 0;
  if (cudaMemsetAsync(ctx_.error_flag, 0, sizeof(int32_t), stream()) != cudaSuccess) return kKernelDeviceError;
  return flagged;
}

}  // namespace

static_assert(cuda::kCudaSuccess == cudaSuccess && cuda::kCudaErrorNoDevice == cudaErrorNoDevice,
              "device_presence.h's copies of the cudaError_t values");

int CudaDeviceCount() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess) return count;
  cudaGetLastError();  // clear the sticky error
  return cuda::UsableDeviceCount(e, count, cuda::CudaDriverLoads());
}

std::unique_ptr<Backend> CreateCudaBackend(const CudaBackendOptions& options, std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  auto backend = std::make_unique<CudaBackend>();
  if (!backend->Init(options, error)) return nullptr;
  return backend;
}

}  // namespace hybridserve::kernels::HS_CUDA_NS
