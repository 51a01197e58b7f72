#ifndef HYBRIDSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define HYBRIDSERVE_KERNELS_CPU_CPU_BACKEND_H_

// The CPU implementation of kernels::Backend: device memory is host memory,
// kernels are the kernels/cpu launchers, run on the backend's own thread pool.
//
// Memory: Allocate returns zero-filled 64-byte-aligned host memory (large
// blocks are anonymous mappings, so untouched pages cost nothing);
// UploadConstant aliases the host bytes (no copy); HostAddress is the
// identity; copies are memcpy and complete before they return.
//
// Thread safety: as kernels::Backend (one caller at a time).

#include <memory>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace hybridserve::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  // num_threads >= 1 counts the calling thread (values < 1 are treated as 1).
  explicit CpuBackend(int num_threads);
  ~CpuBackend() override;

  const char* name() const override { return "cpu"; }
  // The instruction-set path (cpu_features.h), e.g. "avx512_bf16".
  const char* variant() const override;
  int num_threads() const { return pool_->num_threads(); }

  int Allocate(int64_t bytes, DeviceBuffer* out) override;
  int UploadConstant(const void* host, int64_t bytes, DeviceBuffer* out) override;
  int CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;
  int CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  int CopyOnDevice(void* device_dst, const void* device_src, int64_t bytes) override;
  int Fill(void* device_dst, uint8_t value, int64_t bytes) override;
  void* HostAddress(void* device) override { return device; }
  int Synchronize() override { return kKernelOk; }

  int Embedding(const EmbeddingParams& p) override;
  int Matmul(const MatmulParams& p, MatmulMode mode) override;
  int MatmulBatch(const MatmulParams* items, int64_t count, MatmulMode mode) override;
  int RmsNorm(const RmsNormParams& p) override;
  int GatedRmsNorm(const GatedRmsNormParams& p) override;
  int Activation(const ActivationParams& p) override;
  int SwiGlu(const SwiGluParams& p) override;
  int DtSoftplus(const DtSoftplusParams& p) override;
  int CausalConv1d(const CausalConv1dParams& p) override;
  int CausalConv1dUpdate(const CausalConv1dUpdateParams& p) override;
  int SsdChunkScan(const SsdChunkScanParams& p) override;
  int SelectiveStateUpdate(const SelectiveStateUpdateParams& p) override;
  int GatedDeltaGates(const GatedDeltaGatesParams& p) override;
  int GatedDeltaPrefill(const GatedDeltaParams& p) override;
  int GatedDeltaDecode(const GatedDeltaDecodeParams& p) override;
  int KvAppend(const KvAppendParams& p) override;
  int KvAppendDecode(const KvAppendDecodeParams& p) override;
  int AttentionPrefill(const AttentionPrefillParams& p) override;
  int AttentionDecode(const AttentionDecodeParams& p) override;
  int Rope(const RopeParams& p) override;
  int GatherRows(const GatherRowsParams& p) override;
  int ScatterAddRows(const ScatterAddRowsParams& p) override;
  int MoeRoute(const MoeRouteParams& p) override;
  int ExpertMatmul(const ExpertMatmulParams& p, const MatmulParams* also, int64_t also_count, MatmulMode mode) override;
  int MoeCombine(const MoeCombineParams& p) override;

 protected:
  void Release(void* data, int64_t bytes, void* cookie) override;

 private:
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_CPU_BACKEND_H_
