#include "kernels/counting_backend.h"

#include <cstdint>
#include <string>
#include <utility>

namespace hybridserve::kernels {

// Forwards to the inner backend's peer memory and counts each call.
// Thread-safe: mu_ guards the counts.
class CountingBackend::CountingPeerMemory final : public PeerMemory {
 public:
  explicit CountingPeerMemory(PeerMemory& inner) : inner_(inner) {}

  int64_t calls(const std::string& op) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(op);
    return it == calls_.end() ? 0 : it->second;
  }

  void ResetCounts() {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.clear();
  }

  int ExportMemory(const void* device, int64_t bytes, std::string* handle, int64_t* offset) override {
    Count("ExportMemory");
    return inner_.ExportMemory(device, bytes, handle, offset);
  }
  int OpenPeerMemory(const std::string& handle, void** base, int64_t* bytes) override {
    Count("OpenPeerMemory");
    return inner_.OpenPeerMemory(handle, base, bytes);
  }
  int ClosePeerMemory(void* base) override {
    Count("ClosePeerMemory");
    return inner_.ClosePeerMemory(base);
  }
  int CopyToPeer(void* peer_dst, const void* src, int64_t bytes) override {
    Count("CopyToPeer");
    return inner_.CopyToPeer(peer_dst, src, bytes);
  }
  int CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override {
    Count("CopyToHost");
    return inner_.CopyToHost(host_dst, device_src, bytes);
  }
  int CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override {
    Count("CopyToDevice");
    return inner_.CopyToDevice(device_dst, host_src, bytes);
  }

 private:
  void Count(const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_[op];
  }

  PeerMemory& inner_;
  mutable std::mutex mu_;
  std::map<std::string, int64_t> calls_;  // guarded by mu_
};

CountingBackend::CountingBackend(Backend& inner) : inner_(inner) {
  if (PeerMemory* peer = inner_.peer_memory(); peer != nullptr)
    peer_memory_ = std::make_unique<CountingPeerMemory>(*peer);
}

CountingBackend::~CountingBackend() = default;

PeerMemory* CountingBackend::peer_memory() { return peer_memory_.get(); }

int64_t CountingBackend::calls(const std::string& op) const {
  auto it = calls_.find(op);
  const int64_t backend_calls = it == calls_.end() ? 0 : it->second;
  return backend_calls + (peer_memory_ != nullptr ? peer_memory_->calls(op) : 0);
}

int64_t CountingBackend::live_bytes() const {
  int64_t total = 0;
  for (const auto& [start, buffer] : buffers_) total += buffer.bytes();
  return total;
}

void CountingBackend::ResetCounts() {
  calls_.clear();
  if (peer_memory_ != nullptr) peer_memory_->ResetCounts();
  kernel_calls_ = 0;
  foreign_.clear();
}

void CountingBackend::Count(const char* op, bool kernel) {
  ++calls_[op];
  if (kernel) ++kernel_calls_;
}

void CountingBackend::Check(const char* op, const char* field, const void* p) {
  if (p == nullptr) return;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = buffers_.upper_bound(addr);
  if (it != buffers_.begin()) {
    --it;
    if (addr < it->first + static_cast<uintptr_t>(it->second.bytes())) return;
  }
  foreign_.push_back(std::string(op) + "." + field);
}

int CountingBackend::Wrap(DeviceBuffer inner, int status, DeviceBuffer* out) {
  if (status != kKernelOk) return status;
  void* data = inner.data();
  const int64_t bytes = inner.bytes();
  buffers_[reinterpret_cast<uintptr_t>(data)] = std::move(inner);
  *out = MakeBuffer(data, bytes, nullptr);
  return kKernelOk;
}

int CountingBackend::Allocate(int64_t bytes, DeviceBuffer* out) {
  Count("Allocate", false);
  if (out == nullptr) return kKernelInvalidArgument;
  if (memory_limit_ >= 0 && live_bytes() + bytes > memory_limit_) return kKernelOutOfMemory;
  DeviceBuffer inner;
  const int status = inner_.Allocate(bytes, &inner);
  return Wrap(std::move(inner), status, out);
}

int CountingBackend::UploadConstant(const void* host, int64_t bytes, DeviceBuffer* out) {
  Count("UploadConstant", false);
  if (out == nullptr) return kKernelInvalidArgument;
  DeviceBuffer inner;
  const int status = inner_.UploadConstant(host, bytes, &inner);
  return Wrap(std::move(inner), status, out);
}

void CountingBackend::Release(void* data, int64_t /*bytes*/, void* /*cookie*/) {
  buffers_.erase(reinterpret_cast<uintptr_t>(data));
}

int CountingBackend::CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
  Count("CopyToDevice", false);
  Check("CopyToDevice", "device_dst", device_dst);
  return inner_.CopyToDevice(device_dst, host_src, bytes);
}

int CountingBackend::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  Count("CopyToHost", false);
  Check("CopyToHost", "device_src", device_src);
  return inner_.CopyToHost(host_dst, device_src, bytes);
}

int CountingBackend::CopyOnDevice(void* device_dst, const void* device_src, int64_t bytes) {
  Count("CopyOnDevice", false);
  Check("CopyOnDevice", "device_dst", device_dst);
  Check("CopyOnDevice", "device_src", device_src);
  return inner_.CopyOnDevice(device_dst, device_src, bytes);
}

int CountingBackend::Fill(void* device_dst, uint8_t value, int64_t bytes) {
  Count("Fill", false);
  Check("Fill", "device_dst", device_dst);
  return inner_.Fill(device_dst, value, bytes);
}

void* CountingBackend::HostAddress(void* device) {
  Count("HostAddress", false);
  return inner_.HostAddress(device);
}

int CountingBackend::Synchronize() {
  Count("Synchronize", false);
  return inner_.Synchronize();
}

// Each kernel: count, check every pointer field, forward.
#define HS_CHECK(field) Check(kOp, #field, p.field)

int CountingBackend::Embedding(const EmbeddingParams& p) {
  static constexpr char kOp[] = "Embedding";
  Count(kOp, true);
  HS_CHECK(table);
  HS_CHECK(table_bf16);
  HS_CHECK(tokens);
  HS_CHECK(out);
  return inner_.Embedding(p);
}

int CountingBackend::Matmul(const MatmulParams& p, MatmulMode mode) {
  static constexpr char kOp[] = "Matmul";
  Count(kOp, true);
  HS_CHECK(a);
  HS_CHECK(w);
  HS_CHECK(w_bf16);
  HS_CHECK(bias);
  HS_CHECK(out);
  return inner_.Matmul(p, mode);
}

// One call, whatever the item count; every item's pointers checked.
int CountingBackend::MatmulBatch(const MatmulParams* items, int64_t count, MatmulMode mode) {
  if (matmul_batch_item_by_item_) return Backend::MatmulBatch(items, count, mode);
  static constexpr char kOp[] = "MatmulBatch";
  Count(kOp, true);
  for (int64_t i = 0; items != nullptr && i < count; ++i) {
    const MatmulParams& p = items[i];
    HS_CHECK(a);
    HS_CHECK(w);
    HS_CHECK(w_bf16);
    HS_CHECK(bias);
    HS_CHECK(out);
  }
  return inner_.MatmulBatch(items, count, mode);
}

int CountingBackend::RmsNorm(const RmsNormParams& p) {
  static constexpr char kOp[] = "RmsNorm";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(weight);
  HS_CHECK(out);
  return inner_.RmsNorm(p);
}

int CountingBackend::GatedRmsNorm(const GatedRmsNormParams& p) {
  static constexpr char kOp[] = "GatedRmsNorm";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(z);
  HS_CHECK(weight);
  HS_CHECK(out);
  return inner_.GatedRmsNorm(p);
}

int CountingBackend::Activation(const ActivationParams& p) {
  static constexpr char kOp[] = "Activation";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(out);
  return inner_.Activation(p);
}

int CountingBackend::SwiGlu(const SwiGluParams& p) {
  static constexpr char kOp[] = "SwiGlu";
  Count(kOp, true);
  HS_CHECK(gate);
  HS_CHECK(up);
  HS_CHECK(out);
  return inner_.SwiGlu(p);
}

int CountingBackend::DtSoftplus(const DtSoftplusParams& p) {
  static constexpr char kOp[] = "DtSoftplus";
  Count(kOp, true);
  HS_CHECK(dt_raw);
  HS_CHECK(dt_bias);
  HS_CHECK(dt);
  return inner_.DtSoftplus(p);
}

int CountingBackend::CausalConv1d(const CausalConv1dParams& p) {
  static constexpr char kOp[] = "CausalConv1d";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(weight);
  HS_CHECK(bias);
  HS_CHECK(conv_state);
  HS_CHECK(out);
  return inner_.CausalConv1d(p);
}

int CountingBackend::CausalConv1dUpdate(const CausalConv1dUpdateParams& p) {
  static constexpr char kOp[] = "CausalConv1dUpdate";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(weight);
  HS_CHECK(bias);
  HS_CHECK(conv_state);
  HS_CHECK(state_slots);
  HS_CHECK(out);
  return inner_.CausalConv1dUpdate(p);
}

int CountingBackend::SsdChunkScan(const SsdChunkScanParams& p) {
  static constexpr char kOp[] = "SsdChunkScan";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(dt);
  HS_CHECK(A);
  HS_CHECK(B);
  HS_CHECK(C);
  HS_CHECK(D);
  HS_CHECK(initial_state);
  HS_CHECK(y);
  HS_CHECK(final_state);
  HS_CHECK(chunk_states);
  return inner_.SsdChunkScan(p);
}

int CountingBackend::SelectiveStateUpdate(const SelectiveStateUpdateParams& p) {
  static constexpr char kOp[] = "SelectiveStateUpdate";
  Count(kOp, true);
  HS_CHECK(state);
  HS_CHECK(state_slots);
  HS_CHECK(x);
  HS_CHECK(dt);
  HS_CHECK(A);
  HS_CHECK(B);
  HS_CHECK(C);
  HS_CHECK(D);
  HS_CHECK(z);
  HS_CHECK(y);
  return inner_.SelectiveStateUpdate(p);
}

int CountingBackend::GatedDeltaGates(const GatedDeltaGatesParams& p) {
  static constexpr char kOp[] = "GatedDeltaGates";
  Count(kOp, true);
  HS_CHECK(a);
  HS_CHECK(b);
  HS_CHECK(dt_bias);
  HS_CHECK(a_log);
  HS_CHECK(g);
  HS_CHECK(beta);
  return inner_.GatedDeltaGates(p);
}

int CountingBackend::GatedDeltaPrefill(const GatedDeltaParams& p) {
  static constexpr char kOp[] = "GatedDeltaPrefill";
  Count(kOp, true);
  HS_CHECK(q);
  HS_CHECK(k);
  HS_CHECK(v);
  HS_CHECK(g);
  HS_CHECK(beta);
  HS_CHECK(initial_state);
  HS_CHECK(o);
  HS_CHECK(final_state);
  HS_CHECK(chunk_states);
  return inner_.GatedDeltaPrefill(p);
}

int CountingBackend::GatedDeltaDecode(const GatedDeltaDecodeParams& p) {
  static constexpr char kOp[] = "GatedDeltaDecode";
  Count(kOp, true);
  HS_CHECK(state);
  HS_CHECK(state_slots);
  HS_CHECK(q);
  HS_CHECK(k);
  HS_CHECK(v);
  HS_CHECK(g);
  HS_CHECK(beta);
  HS_CHECK(o);
  return inner_.GatedDeltaDecode(p);
}

int CountingBackend::KvAppend(const KvAppendParams& p) {
  static constexpr char kOp[] = "KvAppend";
  Count(kOp, true);
  HS_CHECK(cache.k);
  HS_CHECK(cache.v);
  HS_CHECK(k);
  HS_CHECK(v);
  HS_CHECK(block_table);
  return inner_.KvAppend(p);
}

int CountingBackend::KvAppendDecode(const KvAppendDecodeParams& p) {
  static constexpr char kOp[] = "KvAppendDecode";
  Count(kOp, true);
  HS_CHECK(cache.k);
  HS_CHECK(cache.v);
  HS_CHECK(k);
  HS_CHECK(v);
  HS_CHECK(block_tables);
  HS_CHECK(seq_lens);
  return inner_.KvAppendDecode(p);
}

int CountingBackend::AttentionPrefill(const AttentionPrefillParams& p) {
  static constexpr char kOp[] = "AttentionPrefill";
  Count(kOp, true);
  HS_CHECK(cache.k);
  HS_CHECK(cache.v);
  HS_CHECK(q);
  HS_CHECK(out);
  HS_CHECK(block_table);
  return inner_.AttentionPrefill(p);
}

int CountingBackend::AttentionDecode(const AttentionDecodeParams& p) {
  static constexpr char kOp[] = "AttentionDecode";
  Count(kOp, true);
  HS_CHECK(cache.k);
  HS_CHECK(cache.v);
  HS_CHECK(q);
  HS_CHECK(out);
  HS_CHECK(block_tables);
  HS_CHECK(seq_lens);
  return inner_.AttentionDecode(p);
}

int CountingBackend::Rope(const RopeParams& p) {
  static constexpr char kOp[] = "Rope";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(positions);
  return inner_.Rope(p);
}

int CountingBackend::GatherRows(const GatherRowsParams& p) {
  static constexpr char kOp[] = "GatherRows";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(index);
  HS_CHECK(out);
  return inner_.GatherRows(p);
}

int CountingBackend::ScatterAddRows(const ScatterAddRowsParams& p) {
  static constexpr char kOp[] = "ScatterAddRows";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(index);
  HS_CHECK(weight);
  HS_CHECK(out);
  return inner_.ScatterAddRows(p);
}

int CountingBackend::MoeRoute(const MoeRouteParams& p) {
  static constexpr char kOp[] = "MoeRoute";
  Count(kOp, true);
  HS_CHECK(logits);
  HS_CHECK(bias);
  HS_CHECK(rows);
  HS_CHECK(weights);
  HS_CHECK(offsets);
  HS_CHECK(slots);
  return inner_.MoeRoute(p);
}

int CountingBackend::ExpertMatmul(const ExpertMatmulParams& p, const MatmulParams* also, int64_t also_count,
                                  MatmulMode mode) {
  if (matmul_batch_item_by_item_) return ExpertMatmulItemByItem(p, also, also_count, mode);
  static constexpr char kOp[] = "ExpertMatmul";
  Count(kOp, true);
  HS_CHECK(a);
  HS_CHECK(offsets);
  HS_CHECK(w);
  HS_CHECK(w_bf16);
  HS_CHECK(out);
  for (int64_t i = 0; also != nullptr && i < also_count; ++i) {
    const MatmulParams& item = also[i];
    Check(kOp, "also.a", item.a);
    Check(kOp, "also.w", item.w);
    Check(kOp, "also.w_bf16", item.w_bf16);
    Check(kOp, "also.bias", item.bias);
    Check(kOp, "also.out", item.out);
  }
  return inner_.ExpertMatmul(p, also, also_count, mode);
}

// The offsets copied back (a synchronisation, so never inside a graph), then
// one Matmul per expert with rows and one per `also` item.
int CountingBackend::ExpertMatmulItemByItem(const ExpertMatmulParams& p, const MatmulParams* also, int64_t also_count,
                                            MatmulMode mode) {
  if (const int status = CheckExpertMatmulParams(p); status != kKernelOk) return status;
  if (also_count < 0 || (also_count > 0 && also == nullptr)) return kKernelInvalidArgument;
  std::vector<int32_t> offsets(static_cast<size_t>(p.experts) + 1);
  if (const int status = CopyToHost(offsets.data(), p.offsets, static_cast<int64_t>(offsets.size() * sizeof(int32_t)));
      status != kKernelOk) {
    return status;
  }
  for (int64_t e = 0; e < p.experts; ++e) {
    const int64_t first = offsets[static_cast<size_t>(e)];
    const int64_t count = offsets[static_cast<size_t>(e) + 1] - first;
    if (first < 0 || count < 0 || count > p.max_rows || first + count > p.rows) return kKernelInvalidArgument;
    if (count == 0) continue;
    if (const int status = Matmul(ExpertMatmulItem(p, e, first, count), mode); status != kKernelOk) return status;
  }
  for (int64_t i = 0; i < also_count; ++i) {
    if (const int status = Matmul(also[i], mode); status != kKernelOk) return status;
  }
  return kKernelOk;
}

int CountingBackend::MoeCombine(const MoeCombineParams& p) {
  static constexpr char kOp[] = "MoeCombine";
  Count(kOp, true);
  HS_CHECK(x);
  HS_CHECK(slots);
  HS_CHECK(weights);
  HS_CHECK(out);
  return inner_.MoeCombine(p);
}

int CountingBackend::BeginCapture() {
  Count("BeginCapture", false);
  return inner_.BeginCapture();
}

int CountingBackend::EndCapture(int64_t* graph) {
  Count("EndCapture", false);
  return inner_.EndCapture(graph);
}

int CountingBackend::Replay(int64_t graph) {
  Count("Replay", false);
  return inner_.Replay(graph);
}

int CountingBackend::ReleaseGraph(int64_t graph) {
  Count("ReleaseGraph", false);
  return inner_.ReleaseGraph(graph);
}

#undef HS_CHECK

}  // namespace hybridserve::kernels
