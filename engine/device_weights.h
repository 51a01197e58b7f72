#ifndef HYBRIDSERVE_ENGINE_DEVICE_WEIGHTS_H_
#define HYBRIDSERVE_ENGINE_DEVICE_WEIGHTS_H_

// A model's weights in device memory of one backend, in the form the layer
// runners hand to kernels: the host tensors of ModelWeights uploaded (on the
// CPU backend, aliased: no second copy), plus the few derived tensors the
// runners need (A = -exp(A_log); q, k and v projections as one matrix).
// Matrices keep their resident dtype (fp32 or bf16, WeightMatrix).
// Every pointer is device memory; a bias the model does not have is null.
//
// Immutable after Create; the ModelWeights it was made from must outlive it
// (an aliasing backend reads them in place). Not thread-safe to destroy while
// a kernel runs; otherwise read-only.

#include <cstdint>
#include <memory>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_weights.h"
#include "kernels/backend.h"

namespace hybridserve::engine {

// A matrix on the device in its resident dtype: exactly one pointer is set.
struct DeviceMatrix {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;  // bfloat16 bit patterns
};

// Rows [first_row, ...) of a row-major matrix with `cols` columns.
inline DeviceMatrix RowsFrom(const DeviceMatrix& m, int64_t first_row, int64_t cols) {
  DeviceMatrix out;
  if (m.bf16 != nullptr) out.bf16 = m.bf16 + first_row * cols;
  if (m.f32 != nullptr) out.f32 = m.f32 + first_row * cols;
  return out;
}

struct DeviceMamba2Weights {
  DeviceMatrix in_proj;                  // [in_proj_rows, hidden]
  const float* in_proj_bias = nullptr;   // [in_proj_rows] or null
  const float* conv1d_weight = nullptr;  // [conv_dim, conv_kernel]
  const float* conv1d_bias = nullptr;    // [conv_dim] or null
  const float* dt_bias = nullptr;        // [num_heads]
  const float* A = nullptr;              // [num_heads]; -exp(A_log) in fp32, as transformers computes it
  const float* D = nullptr;              // [num_heads]
  const float* norm = nullptr;           // [d_inner]; null without the gated norm
  DeviceMatrix out_proj;                 // [hidden, d_inner]
  const float* out_proj_bias = nullptr;  // [hidden] or null
};

struct DeviceAttentionWeights {
  // Rows [q | k | v] of one matrix, [q_dim + 2 * kv_dim, hidden]: each output
  // element is the same dot product as with three matrices (bit-identical in
  // deterministic mode), in one kernel call.
  // With AttentionParams::output_gate, the gate rows follow: [q | k | v | gate],
  // [2 * q_dim + 2 * kv_dim, hidden] (and the bias likewise).
  DeviceMatrix qkv_proj;
  const float* qkv_bias = nullptr;     // [q_dim + 2 * kv_dim]: [q | k | v] biases, or null
  const float* q_norm = nullptr;       // [head_dim] (1 + w) with qk_norm, else null
  const float* k_norm = nullptr;       // [head_dim] (1 + w) with qk_norm, else null
  DeviceMatrix o_proj;                 // [hidden, q_dim]
  const float* o_proj_bias = nullptr;  // [hidden] or null
};

struct DeviceMlpWeights {
  DeviceMatrix up_proj;                   // [intermediate, hidden]
  const float* up_proj_bias = nullptr;    // [intermediate] or null
  DeviceMatrix down_proj;                 // [hidden, intermediate]
  const float* down_proj_bias = nullptr;  // [hidden] or null
};

struct DeviceGatedMlpWeights {
  DeviceMatrix gate_up;                   // [2 * intermediate, hidden]: rows [gate | up]
  const float* gate_up_bias = nullptr;    // [2 * intermediate] or null
  DeviceMatrix down_proj;                 // [hidden, intermediate]
  const float* down_proj_bias = nullptr;  // [hidden] or null
};

// d = MoeParams::expert_dim(hidden).
struct DeviceGatedDeltaNetWeights {
  DeviceMatrix in_proj;                  // [in_proj_rows, hidden]: rows [q | k | v | z | b | a]
  const float* conv1d_weight = nullptr;  // [conv_dim, conv_kernel]
  const float* dt_bias = nullptr;        // [num_v_heads]
  const float* a_log = nullptr;          // [num_v_heads]
  const float* norm = nullptr;           // [value_dim]
  DeviceMatrix out_proj;                 // [hidden, value_dim]
};

struct DeviceMoeWeights {
  DeviceMatrix router;                 // [num_experts (+ 1: the shared expert's gate, with shared_gate), hidden]
  const float* router_bias = nullptr;  // [num_experts] or null
  bool has_latent = false;
  DeviceMatrix latent_in;     // [latent, hidden] when has_latent (fc1_latent_proj)
  DeviceMatrix latent_out;    // [hidden, latent] (fc2_latent_proj)
  DeviceMatrix experts_up;    // [num_experts * up_rows(inter), d]
  DeviceMatrix experts_down;  // [num_experts * d, inter]
  bool has_shared = false;
  DeviceMatrix shared_up;                   // [up_rows(shared), hidden] when has_shared
  DeviceMatrix shared_down;                 // [hidden, shared]
  const float* shared_up_bias = nullptr;    // [up_rows(shared)] or null
  const float* shared_down_bias = nullptr;  // [hidden] or null
};

// y += up(down(x)); both null for a use without an adapter.
struct DeviceLora {
  DeviceMatrix down;  // [rank, in]
  DeviceMatrix up;    // [out, rank]
  bool present() const { return down.f32 != nullptr || down.bf16 != nullptr; }
};

struct DeviceZambaSharedBlock {
  const float* input_norm = nullptr;   // [2 * hidden]
  DeviceAttentionWeights attention;    // qkv [q_dim + 2 * kv_dim, 2 * hidden], o [hidden, q_dim]
  const float* pre_ff_norm = nullptr;  // [hidden]
  DeviceGatedMlpWeights mlp;
};

struct DeviceZambaHybridWeights {
  int64_t block = 0;
  // q, k and v adapters' down projections stacked, [3 * rank, 2 * hidden], and
  // their up projections; absent without use_shared_attention_adapter.
  DeviceMatrix qkv_adapter_down;
  DeviceMatrix q_adapter_up, k_adapter_up, v_adapter_up;
  DeviceLora gate_up_adapter;
  DeviceMatrix linear;                // [hidden, hidden]
  const float* mamba_norm = nullptr;  // [hidden]
  DeviceMamba2Weights mamba;
};

struct DeviceParallelWeights {
  DeviceMamba2Weights mamba;
  DeviceAttentionWeights attention;
};

struct DeviceLayerWeights {
  const float* norm = nullptr;  // [hidden]; RMSNorm before the block
  std::variant<DeviceMamba2Weights, DeviceAttentionWeights, DeviceMlpWeights, DeviceGatedMlpWeights, DeviceMoeWeights,
               DeviceParallelWeights, DeviceZambaHybridWeights, DeviceGatedDeltaNetWeights>
      mixer;

  // Precondition: the layer is of that kind (checked by std::get).
  const DeviceMamba2Weights& mamba2() const { return std::get<DeviceMamba2Weights>(mixer); }
  const DeviceAttentionWeights& attention() const { return std::get<DeviceAttentionWeights>(mixer); }
  const DeviceMlpWeights& mlp() const { return std::get<DeviceMlpWeights>(mixer); }
  const DeviceGatedMlpWeights& gated_mlp() const { return std::get<DeviceGatedMlpWeights>(mixer); }
  const DeviceMoeWeights& moe() const { return std::get<DeviceMoeWeights>(mixer); }
  const DeviceParallelWeights& parallel() const { return std::get<DeviceParallelWeights>(mixer); }
  const DeviceZambaHybridWeights& zamba_hybrid() const { return std::get<DeviceZambaHybridWeights>(mixer); }
  const DeviceGatedDeltaNetWeights& gated_deltanet() const { return std::get<DeviceGatedDeltaNetWeights>(mixer); }
};

class DeviceWeights {
 public:
  // Uploads `weights` to `backend` (which must outlive the result).
  // RESOURCE_EXHAUSTED when the device cannot hold them.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Create(const ModelWeights& weights, kernels::Backend& backend);

  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  const DeviceMatrix& embeddings() const { return embeddings_; }  // [vocab, hidden]
  const float* norm_f() const { return norm_f_; }                 // [hidden]
  const DeviceMatrix& lm_head() const { return lm_head_; }        // [vocab, hidden]
  const DeviceLayerWeights& layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }
  const DeviceZambaSharedBlock& shared_block(int64_t b) const { return shared_blocks_[static_cast<size_t>(b)]; }
  // Device bytes this object allocated (aliased host tensors not counted).
  int64_t allocated_bytes() const { return allocated_bytes_; }

 private:
  class Uploader;
  DeviceWeights() = default;

  DeviceMatrix embeddings_;
  const float* norm_f_ = nullptr;
  DeviceMatrix lm_head_;
  std::vector<DeviceLayerWeights> layers_;
  std::vector<DeviceZambaSharedBlock> shared_blocks_;
  std::vector<kernels::DeviceBuffer> buffers_;  // owns every pointer above
  int64_t allocated_bytes_ = 0;
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_DEVICE_WEIGHTS_H_
