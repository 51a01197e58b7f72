#ifndef HYBRIDSERVE_KERNELS_CPU_GATED_DELTA_H_
#define HYBRIDSERVE_KERNELS_CPU_GATED_DELTA_H_

// CPU gated delta rule (kernels/gated_delta_params.h): the sequential oracle,
// the chunked prefill on the absolute chunk grid, and the one-token decode
// update, and the gates (g, beta) from the layer's projections. fp32. The
// last three take an optional thread pool (null: the calling thread) and splits
// only independent work over it (value heads; decode rows x heads; gate rows),
// so the bits never depend on the thread count. The CPU backend
// (cpu_backend.h) runs GatedDeltaChunked as its prefill.

#include "kernels/cpu/thread_pool.h"
#include "kernels/gated_delta_params.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {

// The oracle: token by token, exactly the recurrence of the params header
// (transformers' torch_recurrent_gated_delta_rule). Writes o, final_state and
// chunk_states (the state after each token just before an absolute boundary).
KernelStatus GatedDeltaSequential(const GatedDeltaParams& p, const char** bad_field = nullptr);

// The chunked prefill (transformers' torch_chunk_gated_delta_rule): per block
// of GatedDeltaBlockSize(chunk_size) tokens on the absolute grid (the first
// one partial when start_pos is mid-block, the last one partial when the call
// ends mid-block), the block-local UT transform (a unit lower-triangular solve
// for the corrected values, with the read of the old state folded into its
// right-hand side), then the block output and the state recurrence, on
// small_gemm's fixed-order register tiles. chunk_states rows at chunk_size
// boundaries.
KernelStatus GatedDeltaChunked(const GatedDeltaParams& p, const char** bad_field = nullptr, ThreadPool* pool = nullptr);

// One decode step per batch row; bit-identical to one step of
// GatedDeltaSequential. A slot outside [0, num_slots) (other than a negative
// padding slot) rejects the whole call, naming "state_slots", before any write.
KernelStatus GatedDeltaDecode(const GatedDeltaDecodeParams& p, const char** bad_field = nullptr,
                              ThreadPool* pool = nullptr);

// beta = sigmoid(b), g = -exp(a_log) * softplus(a + dt_bias), in transformers'
// fp32 order (the scalar Sigmoid and Softplus of activations.h).
KernelStatus GatedDeltaGates(const GatedDeltaGatesParams& p, const char** bad_field = nullptr,
                             ThreadPool* pool = nullptr);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_GATED_DELTA_H_
