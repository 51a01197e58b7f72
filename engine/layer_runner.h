#ifndef HYBRIDSERVE_ENGINE_LAYER_RUNNER_H_
#define HYBRIDSERVE_ENGINE_LAYER_RUNNER_H_

// The interface between the Model and one layer kind: a layer computes its
// mixer on the pre-normed hidden states and adds the result to the residual
// stream, for one prefill segment of one sequence or for one decode step of a
// batch. A new layer kind (docs/ARCHITECTURE.md section 3) implements LayerRunner and is
// added to the one switch in model.cc that builds runners.
//
// Runners reach kernels only through LayerEnv::backend, and every pointer
// they see (activations, weights, pools, index arrays) is device memory of
// that backend.
//
// Internal to the engine. Not thread-safe: runners share the Model's scratch
// and state pools, and the Model serializes every call.

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/device_weights.h"
#include "engine/kv_page_pool.h"
#include "engine/state_slot_pool.h"
#include "kernels/backend.h"
#include "kernels/matmul_params.h"

namespace hybridserve::engine {

// The named device scratch buffers of a model.
enum WorkspaceBuffer : int {
  // Free for the layer runners; contents unspecified on entry to a layer.
  kScratch0 = 0,
  kScratch1,
  kScratch2,
  kScratch3,
  // A block's output before its scaled residual add (LinearToResidual).
  kBlockOut,
  // A mixer's input times its in-multiplier (ScaledInput).
  kMixerInput,
  // A parallel block's summed mixer outputs (Zamba2: a hybrid layer's
  // concatenated input, then its Mamba2 input).
  kParallelSum,
  // A copy of the model's input embeddings for the current rows (Zamba2).
  kEmbeddings,
  // The Model's block loop: hidden states, their norm, logits ([rows, *] fp32).
  kHidden,
  kNormed,
  kLogits,
  // Index arrays uploaded per call (int32): token ids, block tables, state
  // slots, sequence lengths.
  kTokenIds,
  kBlockTables,
  kStateSlots,
  kSeqLens,
  kPositions,  // int64 positions of a decode step's rows (RoPE)
  // A mixture-of-experts block's routing (kernels/moe_params.h), written on
  // the device by MoeRoute.
  kRouteRows,     // int32: the block's rows, grouped by expert
  kRouteWeights,  // fp32: their routing weights
  kRouteOffsets,  // int32: each expert's range of them
  kRouteSlots,    // int32: each row's entries, in ascending expert order
  kNumWorkspaceBuffers,
};

// Device scratch memory shared by all layers of a model; buffers grow on
// demand (contents are not kept when one grows) and are never shrunk.
class Workspace {
 public:
  // `backend` must outlive the workspace.
  explicit Workspace(kernels::Backend& backend) : backend_(backend) {}

  // Buffer `index` with room for at least `count` elements of T (device
  // memory); RESOURCE_EXHAUSTED when the device cannot grow it.
  template <typename T>
  absl::StatusOr<T*> Get(WorkspaceBuffer index, int64_t count) {
    absl::StatusOr<void*> p = GetBytes(index, count * static_cast<int64_t>(sizeof(T)));
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }
  // Uploads `host` into buffer `index` and returns its device copy.
  absl::StatusOr<const int32_t*> Upload(WorkspaceBuffer index, const int32_t* host, int64_t count);
  absl::StatusOr<const int64_t*> Upload(WorkspaceBuffer index, const int64_t* host, int64_t count);
  absl::StatusOr<const float*> Upload(WorkspaceBuffer index, const float* host, int64_t count);
  // Bumped whenever a buffer is reallocated (its address changes): a
  // recorded graph that names workspace buffers is stale once it moves.
  int64_t generation() const { return generation_; }

 private:
  absl::StatusOr<void*> GetBytes(WorkspaceBuffer index, int64_t bytes);
  absl::StatusOr<void*> UploadBytes(WorkspaceBuffer index, const void* host, int64_t bytes);

  kernels::Backend& backend_;
  std::array<kernels::DeviceBuffer, kNumWorkspaceBuffers> buffers_;
  int64_t generation_ = 0;
};

// What every layer uses besides its weights; the Model owns all of it and
// outlives its runners.
struct LayerEnv {
  kernels::Backend* backend = nullptr;
  kernels::MatmulMode matmul_mode = kernels::MatmulMode::kDeterministic;
  KvPagePool* kv_pages = nullptr;
  StateSlotPool* state_slots = nullptr;
  Workspace* workspace = nullptr;
  // Every block adds residual_multiplier * its output to the residual stream
  // (Granite's μP multiplier; 1 elsewhere).
  float residual_multiplier = 1.0f;
};

// One prefill segment of one sequence: tokens at absolute positions
// [start_pos, start_pos + n_tokens).
struct PrefillSegment {
  int64_t start_pos = 0;
  int64_t n_tokens = 0;
  int32_t state_slot = -1;               // the sequence's row in the state pools
  const int32_t* block_table = nullptr;  // device: [>= ceil((start_pos + n_tokens) / page_size)] KV page ids
};

// One decode step: one token per sequence, sequence b at position seq_lens[b] - 1.
struct DecodeBatch {
  int64_t batch = 0;
  const int32_t* state_slots = nullptr;   // device: [batch]
  const int32_t* block_tables = nullptr;  // device: [batch, block_table_stride]
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;   // device: [batch], tokens including the new one
  const int64_t* positions = nullptr;  // device: [batch], seq_lens[b] - 1 (padding rows 0)
};

class LayerRunner {
 public:
  virtual ~LayerRunner() = default;

  // residual[t] += mixer(normed[t]) for the segment's tokens; both [n_tokens, hidden].
  // A block without a pre-norm (DeviceLayerWeights::norm null) gets the
  // residual stream itself as `normed`.
  // Updates the sequence's state (SSM/conv state, KV pages) for those tokens.
  virtual absl::Status Prefill(const PrefillSegment& segment, const float* normed, float* residual) = 0;
  // residual[b] += mixer(normed[b]) for each sequence of the batch; both [batch, hidden].
  virtual absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) = 0;
};

// The MatmulParams of out[m, n] (+)= a[m, k] @ w[n, k]^T + bias[n], packed
// rows, w in its resident dtype (Linear's call; a MatmulBatch item).
kernels::MatmulParams LinearParams(const float* a, int64_t m, int64_t k, const DeviceMatrix& w, int64_t n,
                                   const float* bias, float* out, bool accumulate);

// out[m, n] (+)= a[m, k] @ w[n, k]^T + bias[n] in the env's matmul mode on the
// env's backend, w in its resident dtype; `bias` may be null. Packed rows,
// device memory.
absl::Status Linear(const LayerEnv& env, const float* a, int64_t m, int64_t k, const DeviceMatrix& w, int64_t n,
                    const float* bias, float* out, bool accumulate, absl::string_view what);

// A block's last projection into the residual stream:
//   residual[m, n] += residual_multiplier * (a[m, k] @ w[n, k]^T + bias[n]).
// With the multiplier 1 this is one accumulating Linear (residual + y, as the
// reference adds); otherwise y goes to kBlockOut and is added scaled, y * m
// rounded then added, as transformers computes `residual + y * multiplier`.
absl::Status LinearToResidual(const LayerEnv& env, const float* a, int64_t m, int64_t k, const DeviceMatrix& w,
                              int64_t n, const float* bias, float* residual, absl::string_view what);

// x when alpha is 1, else alpha * x[n, dim] written to kMixerInput (Falcon-H1's
// ssm_in_multiplier and attention_in_multiplier).
absl::StatusOr<const float*> ScaledInput(const LayerEnv& env, const float* x, int64_t n, int64_t dim, float alpha);

// x[r, first .. first + cols) *= alpha for rows r < n of row stride `stride`,
// in place (no-op for 1): a multiplier on some output columns of a projection.
absl::Status ScaleColumns(const LayerEnv& env, float* x, int64_t n, int64_t first, int64_t cols, int64_t stride,
                          float alpha);

// `env` with its residual multiplier times `multiplier` (exact when either is 1).
LayerEnv WithOutputMultiplier(LayerEnv env, float multiplier);

// residual[m, n] += residual_multiplier * y[m, n] (packed rows).
absl::Status AddToResidual(const LayerEnv& env, const float* y, int64_t m, int64_t n, float* residual);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_LAYER_RUNNER_H_
