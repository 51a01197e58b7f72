#include "kernels/cpu/cpu_backend.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/conv1d.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/ssd_scan.h"

namespace hybridserve::kernels::cpu {
namespace {

constexpr size_t kAlignment = 64;
// At and above this size, Allocate maps anonymous memory: zero pages that cost
// nothing until touched (a large KV pool is mostly untouched at start-up).
constexpr int64_t kMapThreshold = int64_t{1} << 20;

// Cookies that tell Release how a block was obtained.
char kMappedCookie;
char kHeapCookie;
char kAliasCookie;

bool Disjoint(const void* a, const void* b, int64_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x + static_cast<uintptr_t>(bytes) <= y || y + static_cast<uintptr_t>(bytes) <= x;
}

}  // namespace

CpuBackend::CpuBackend(int num_threads) : pool_(std::make_unique<ThreadPool>(num_threads)) {}

CpuBackend::~CpuBackend() = default;

int CpuBackend::Allocate(int64_t bytes, DeviceBuffer* out) {
  if (out == nullptr || bytes < 1) return kKernelInvalidArgument;
  if (bytes >= kMapThreshold) {
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return kKernelOutOfMemory;
    *out = MakeBuffer(p, bytes, &kMappedCookie);
    return kKernelOk;
  }
  const size_t rounded = (static_cast<size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) return kKernelOutOfMemory;
  std::memset(p, 0, rounded);
  *out = MakeBuffer(p, bytes, &kHeapCookie);
  return kKernelOk;
}

int CpuBackend::UploadConstant(const void* host, int64_t bytes, DeviceBuffer* out) {
  if (out == nullptr || host == nullptr || bytes < 1) return kKernelInvalidArgument;
  *out = MakeBuffer(const_cast<void*>(host), bytes, &kAliasCookie);
  return kKernelOk;
}

void CpuBackend::Release(void* data, int64_t bytes, void* cookie) {
  if (cookie == &kMappedCookie) munmap(data, static_cast<size_t>(bytes));
  if (cookie == &kHeapCookie) std::free(data);
  // kAliasCookie: the host owns the bytes.
}

int CpuBackend::CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
  if (bytes < 0 || (bytes > 0 && (device_dst == nullptr || host_src == nullptr))) return kKernelInvalidArgument;
  if (bytes > 0 && !Disjoint(device_dst, host_src, bytes)) return kKernelInvalidArgument;
  if (bytes > 0) std::memcpy(device_dst, host_src, static_cast<size_t>(bytes));
  return kKernelOk;
}

int CpuBackend::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  return CopyToDevice(host_dst, device_src, bytes);
}

int CpuBackend::CopyOnDevice(void* device_dst, const void* device_src, int64_t bytes) {
  return CopyToDevice(device_dst, device_src, bytes);
}

int CpuBackend::Fill(void* device_dst, uint8_t value, int64_t bytes) {
  if (bytes < 0 || (bytes > 0 && device_dst == nullptr)) return kKernelInvalidArgument;
  if (bytes > 0) std::memset(device_dst, value, static_cast<size_t>(bytes));
  return kKernelOk;
}

int CpuBackend::Embedding(const EmbeddingParams& p) { return cpu::Embedding(p, pool_.get()); }
const char* CpuBackend::variant() const { return KernelPathName(ActiveKernelPath()); }

int CpuBackend::Matmul(const MatmulParams& p, MatmulMode mode) { return cpu::Matmul(p, mode, pool_.get()); }
int CpuBackend::MatmulBatch(const MatmulParams* items, int64_t count, MatmulMode mode) {
  return cpu::MatmulBatch(items, count, mode, pool_.get());
}
int CpuBackend::RmsNorm(const RmsNormParams& p) { return cpu::RmsNorm(p, pool_.get()); }
int CpuBackend::GatedRmsNorm(const GatedRmsNormParams& p) { return cpu::GatedRmsNorm(p, pool_.get()); }
int CpuBackend::Activation(const ActivationParams& p) { return cpu::Activation(p, pool_.get()); }
int CpuBackend::SwiGlu(const SwiGluParams& p) { return cpu::SwiGlu(p, pool_.get()); }
int CpuBackend::DtSoftplus(const DtSoftplusParams& p) { return cpu::DtSoftplus(p, pool_.get()); }
int CpuBackend::CausalConv1d(const CausalConv1dParams& p) { return cpu::CausalConv1d(p, pool_.get()); }
int CpuBackend::CausalConv1dUpdate(const CausalConv1dUpdateParams& p) {
  return cpu::CausalConv1dUpdate(p, pool_.get());
}
int CpuBackend::SsdChunkScan(const SsdChunkScanParams& p) { return cpu::SsdChunkScan(p, pool_.get()); }
int CpuBackend::SelectiveStateUpdate(const SelectiveStateUpdateParams& p) {
  return cpu::SelectiveStateUpdate(p, pool_.get());
}
// Gated DeltaNet: value heads (decode: rows x value heads) split over the pool.
int CpuBackend::GatedDeltaGates(const GatedDeltaGatesParams& p) {
  return cpu::GatedDeltaGates(p, nullptr, pool_.get());
}
int CpuBackend::GatedDeltaPrefill(const GatedDeltaParams& p) { return cpu::GatedDeltaChunked(p, nullptr, pool_.get()); }
int CpuBackend::GatedDeltaDecode(const GatedDeltaDecodeParams& p) {
  return cpu::GatedDeltaDecode(p, nullptr, pool_.get());
}
int CpuBackend::KvAppend(const KvAppendParams& p) { return cpu::KvAppend(p, pool_.get()); }
int CpuBackend::KvAppendDecode(const KvAppendDecodeParams& p) { return cpu::KvAppendDecode(p, pool_.get()); }
int CpuBackend::AttentionPrefill(const AttentionPrefillParams& p) { return cpu::AttentionPrefill(p, pool_.get()); }
int CpuBackend::AttentionDecode(const AttentionDecodeParams& p) { return cpu::AttentionDecode(p, pool_.get()); }
int CpuBackend::Rope(const RopeParams& p) { return cpu::Rope(p, pool_.get()); }
int CpuBackend::GatherRows(const GatherRowsParams& p) { return cpu::GatherRows(p, pool_.get()); }
int CpuBackend::ScatterAddRows(const ScatterAddRowsParams& p) { return cpu::ScatterAddRows(p, pool_.get()); }
int CpuBackend::MoeRoute(const MoeRouteParams& p) { return cpu::MoeRoute(p, pool_.get()); }
int CpuBackend::ExpertMatmul(const ExpertMatmulParams& p, const MatmulParams* also, int64_t also_count,
                             MatmulMode mode) {
  return cpu::ExpertMatmul(p, also, also_count, mode, pool_.get());
}
int CpuBackend::MoeCombine(const MoeCombineParams& p) { return cpu::MoeCombine(p, pool_.get()); }

}  // namespace hybridserve::kernels::cpu
