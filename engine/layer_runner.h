#ifndef HYBRIDSERVE_ENGINE_LAYER_RUNNER_H_
#define HYBRIDSERVE_ENGINE_LAYER_RUNNER_H_

// The interface between the Model and one layer kind: a layer computes its
// mixer on the pre-normed hidden states and adds the result to the residual
// stream, for one prefill segment of one sequence or for one decode step of a
// batch. A new layer kind (DESIGN.md section 2) implements LayerRunner and is
// added to the one switch in model.cc that builds runners.
//
// Internal to the engine. Not thread-safe: runners share the Model's scratch
// and state pools, and the Model serializes every call.

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/kv_page_pool.h"
#include "engine/state_slot_pool.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul_params.h"

namespace hybridserve::engine {

// Scratch memory shared by all layers of a model; buffers grow on demand and
// are never shrunk. Contents are unspecified on entry to a layer.
class Workspace {
 public:
  static constexpr int kNumBuffers = 4;
  // Buffer `index` (< kNumBuffers) with room for at least `floats` floats.
  float* Get(int index, int64_t floats) {
    std::vector<float>& b = buffers_[static_cast<size_t>(index)];
    if (static_cast<int64_t>(b.size()) < floats) b.resize(static_cast<size_t>(floats));
    return b.data();
  }

 private:
  std::array<std::vector<float>, kNumBuffers> buffers_;
};

// What every layer uses besides its weights; the Model owns all of it and
// outlives its runners.
struct LayerEnv {
  kernels::cpu::ThreadPool* pool = nullptr;  // may be null: runs on the caller
  kernels::MatmulMode matmul_mode = kernels::MatmulMode::kDeterministic;
  KvPagePool* kv_pages = nullptr;
  StateSlotPool* state_slots = nullptr;
  Workspace* workspace = nullptr;
};

// One prefill segment of one sequence: tokens at absolute positions
// [start_pos, start_pos + n_tokens).
struct PrefillSegment {
  int64_t start_pos = 0;
  int64_t n_tokens = 0;
  int32_t state_slot = -1;               // the sequence's row in the state pools
  const int32_t* block_table = nullptr;  // [>= ceil((start_pos + n_tokens) / page_size)] KV page ids
};

// One decode step: one token per sequence, sequence b at position seq_lens[b] - 1.
struct DecodeBatch {
  int64_t batch = 0;
  const int32_t* state_slots = nullptr;   // [batch]
  const int32_t* block_tables = nullptr;  // [batch, block_table_stride]
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;  // [batch], tokens including the new one
};

class LayerRunner {
 public:
  virtual ~LayerRunner() = default;

  // residual[t] += mixer(normed[t]) for the segment's tokens; both [n_tokens, hidden].
  // Updates the sequence's state (SSM/conv state, KV pages) for those tokens.
  virtual absl::Status Prefill(const PrefillSegment& segment, const float* normed, float* residual) = 0;
  // residual[b] += mixer(normed[b]) for each sequence of the batch; both [batch, hidden].
  virtual absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) = 0;
};

// OK for kKernelOk, else INTERNAL naming the kernel (the engine validates its
// inputs, so a kernel error is an engine bug).
absl::Status KernelStatusToStatus(int kernel_status, absl::string_view kernel);

// out[m, n] (+)= a[m, k] @ w[n, k]^T + bias[n] in the env's matmul mode
// (env.pool and env.matmul_mode only); `bias` may be empty. Packed rows.
absl::Status Linear(const LayerEnv& env, const float* a, int64_t m, int64_t k, absl::Span<const float> w, int64_t n,
                    absl::Span<const float> bias, float* out, bool accumulate, absl::string_view what);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_LAYER_RUNNER_H_
