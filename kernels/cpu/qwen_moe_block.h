#ifndef HYBRIDSERVE_KERNELS_CPU_QWEN_MOE_BLOCK_H_
#define HYBRIDSERVE_KERNELS_CPU_QWEN_MOE_BLOCK_H_

// Qwen3-Next's and Qwen3.5-MoE's sparse MoE block on the CPU, fp32, as
// transformers 5.23's Qwen3NextSparseMoeBlock / Qwen3_5MoeSparseMoeBlock
// computes it (models/qwen3_next/modeling_qwen3_next.py, eager experts): the
// reference the engine's block will be checked against. Not wired into the
// engine (issue 50). Per row x [hidden]:
//   logits = router x                      [num_experts]
//   p = softmax(logits) (fp32, max subtracted)
//   the top_k largest p, chosen as torch.topk does on the CPU (below)
//   w_j = p_j / (sum of the chosen p, in top-k order) when norm_topk_prob
//         (always for Qwen3.5-MoE), else w_j = p_j
//   routed = 0; for each chosen expert e in ascending e:
//     routed += w_e * down_e(silu(gate_e x) * up_e x)
//   y = routed + sigmoid(shared_expert_gate x) * shared_down(silu(shared_gate x) * shared_up x)
// Every product is a dot product summed in ascending input index (fp32).
//
// Ties: torch.topk (ATen TopKImpl.h) pairs each value with its index and, when
// k * 64 <= num_experts, std::partial_sorts them by value alone; otherwise it
// std::nth_elements at k - 1 and std::sorts the first k - 1. Both orderings
// compare values only, so which of several equal probabilities wins is
// whatever those libstdc++ algorithms leave, not the lowest index (8 equal
// probabilities, k 2: experts 6 and 5). This block runs the same algorithms
// with the same comparator (values widened to double, as torch's accscalar_t)
// on the same input order, so it chooses what torch chooses where the standard
// library's algorithms are the same; the fixture's rows with ties check it.
//
// A row's bits depend only on that row: batch-invariant by construction.

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {

// transformers' parameter tensors (no biases), flat row-major. The routed
// experts are fused 3-D tensors as transformers 5.23 holds them (Qwen3NextExperts):
// gate_up_proj[e] is expert e's gate_proj rows then its up_proj rows.
// (Qwen3-Next checkpoints store mlp.experts.<e>.{gate,up,down}_proj.weight,
// which transformers stacks into these on load; Qwen3.5-MoE's store these.)
struct QwenMoeBlockWeights {
  const float* router = nullptr;              // [num_experts, hidden]: mlp.gate.weight
  const float* experts_gate_up = nullptr;     // [num_experts, 2 * moe_intermediate, hidden]
  const float* experts_down = nullptr;        // [num_experts, hidden, moe_intermediate]
  const float* shared_gate_proj = nullptr;    // [shared_intermediate, hidden]
  const float* shared_up_proj = nullptr;      // [shared_intermediate, hidden]
  const float* shared_down_proj = nullptr;    // [hidden, shared_intermediate]
  const float* shared_expert_gate = nullptr;  // [1, hidden]
};

struct QwenMoeBlockShape {
  int64_t hidden = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;                // num_experts_per_tok, in [1, num_experts]
  int64_t moe_intermediate = 0;     // each routed expert's width
  int64_t shared_intermediate = 0;  // shared_expert_intermediate_size
  bool norm_topk_prob = true;       // Qwen3.5-MoE: always true
};

// kKernelInvalidArgument naming the first bad shape field or null weight.
KernelStatus CheckQwenMoeBlockShape(const QwenMoeBlockShape& s, const QwenMoeBlockWeights& w,
                                    const char** bad_field = nullptr);

// x [n, hidden] -> y [n, hidden] (y must not alias x). chosen [n, top_k] and
// chosen_weight [n, top_k], each optional (null: not written), receive every
// row's experts in torch.topk's order and their weights w_j.
KernelStatus QwenMoeBlockForward(const QwenMoeBlockShape& s, const QwenMoeBlockWeights& w, const float* x, int64_t n,
                                 float* y, int32_t* chosen = nullptr, float* chosen_weight = nullptr,
                                 const char** bad_field = nullptr);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_QWEN_MOE_BLOCK_H_
