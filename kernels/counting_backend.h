#ifndef HYBRIDSERVE_KERNELS_COUNTING_BACKEND_H_
#define HYBRIDSERVE_KERNELS_COUNTING_BACKEND_H_

// A Backend for tests that forwards every call to another backend and records
// it: a count per operation, and every pointer a kernel or copy received that
// does not lie inside a live buffer of this backend ("foreign" pointers: host
// memory that a device backend could not read). With it a test proves that
// the engine reaches kernels only through the interface and hands them only
// device memory.
//
// Its peer_memory() (present when the inner backend's is) forwards and counts
// the sharing calls too, under their method names ("CopyToPeer", ...).
//
// Thread safety: as kernels::Backend (one caller at a time); peer_memory() is
// thread-safe, and calls(op) may be read while its calls run elsewhere.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace hybridserve::kernels {

class CountingBackend final : public Backend {
 public:
  // `inner` must outlive this backend and every buffer it hands out.
  explicit CountingBackend(Backend& inner);
  ~CountingBackend() override;

  const char* name() const override { return inner_.name(); }

  // Calls of each backend operation so far, by name ("Matmul", "SsdChunkScan", ...).
  const std::map<std::string, int64_t>& calls() const { return calls_; }
  // Calls of one operation so far, of the backend or of its peer memory.
  int64_t calls(const std::string& op) const;
  // Kernel calls (not memory calls) so far.
  int64_t kernel_calls() const { return kernel_calls_; }
  // "Op.field" for every pointer outside the live buffers, in call order.
  const std::vector<std::string>& foreign_pointers() const { return foreign_; }
  int64_t live_buffers() const { return static_cast<int64_t>(buffers_.size()); }
  int64_t live_bytes() const;
  void ResetCounts();
  // Allocations that would take the live bytes above `bytes` fail with
  // kKernelOutOfMemory (a device that is full); negative: no limit.
  void set_memory_limit(int64_t bytes) { memory_limit_ = bytes; }
  // MatmulBatch issued item by item through Matmul (Backend's default, each
  // item counted as a Matmul) instead of forwarded whole, and ExpertMatmul as
  // one Matmul per expert with rows and per extra item (its offsets copied
  // back first, so not while a graph is captured): tests compare the inner
  // backend's batched paths with its single calls.
  void set_matmul_batch_item_by_item(bool on) { matmul_batch_item_by_item_ = on; }

  int Allocate(int64_t bytes, DeviceBuffer* out) override;
  int UploadConstant(const void* host, int64_t bytes, DeviceBuffer* out) override;
  int CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;
  int CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  int CopyOnDevice(void* device_dst, const void* device_src, int64_t bytes) override;
  int Fill(void* device_dst, uint8_t value, int64_t bytes) override;
  void* HostAddress(void* device) override;
  int Synchronize() override;

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

  bool supports_graphs() const override { return inner_.supports_graphs(); }
  int BeginCapture() override;
  int EndCapture(int64_t* graph) override;
  int Replay(int64_t graph) override;
  int ReleaseGraph(int64_t graph) override;
  PeerMemory* peer_memory() override;

 protected:
  void Release(void* data, int64_t bytes, void* cookie) override;

 private:
  // Counts a call of `op` (a kernel when `kernel`).
  void Count(const char* op, bool kernel);
  int ExpertMatmulItemByItem(const ExpertMatmulParams& p, const MatmulParams* also, int64_t also_count,
                             MatmulMode mode);
  class CountingPeerMemory;
  // Records op.field unless `p` is null or inside a live buffer.
  void Check(const char* op, const char* field, const void* p);
  int Wrap(DeviceBuffer inner, int status, DeviceBuffer* out);

  Backend& inner_;
  std::map<uintptr_t, DeviceBuffer> buffers_;  // by start address: the inner buffers handed out
  std::map<std::string, int64_t> calls_;
  int64_t kernel_calls_ = 0;
  std::vector<std::string> foreign_;
  int64_t memory_limit_ = -1;
  bool matmul_batch_item_by_item_ = false;
  std::unique_ptr<CountingPeerMemory> peer_memory_;  // null when the inner backend has none
};

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_COUNTING_BACKEND_H_
