#ifndef HYBRIDSERVE_KERNELS_MOE_PARAMS_H_
#define HYBRIDSERVE_KERNELS_MOE_PARAMS_H_

// A mixture-of-experts block's routing, its experts' projections and their
// weighted combination, all on the device, so that nothing in a block waits
// for the host and a decode step with expert blocks can be recorded as a graph
// (engine/moe_layer.h):
//   MoeRoute      router logits -> each row's top_k experts and weights, the
//                 entries grouped by ascending expert (rows ascending within
//                 an expert), per-expert offsets, and each row's slots;
//   ExpertMatmul  each expert's rows (a contiguous range named by the
//                 offsets, which only the device knows) times that expert's
//                 weights;
//   MoeCombine    each row's expert outputs, weighted, added in ascending
//                 expert order.
//
// The index arrays (offsets, slots, rows) live in device memory. MoeRoute
// writes them; the other two read them without range checks beyond what is
// stated (as kernels/rows_params.h's indices): the router owns their range.

#include <cstdint>
#include <limits>

#include "kernels/kernel_status.h"
#include "kernels/matmul_params.h"

namespace hybridserve::kernels {

enum class MoeRouterKind : int {
  // Granite: the top_k logits (ties to the lower expert id), largest first,
  // then a softmax over those k (fp32, max subtracted).
  kTopKSoftmax = 0,
  // Qwen3-Next / Qwen3.5-MoE: a softmax over every expert (fp32, max
  // subtracted, each exp divided by the sum taken in ascending expert order),
  // the top_k probabilities, divided by their sum when norm_topk_prob. Which
  // of exactly tied probabilities is chosen at the k-th place: torch.topk's
  // CPU order on the CPU backend (kernels/torch_topk.h), the lower expert id
  // on the CUDA backend (torch's own CUDA topk makes no promise either).
  kSoftmaxTopK = 1,
  // Nemotron-H / DeepSeek-V3: scores sigmoid(logit); a choice score of score +
  // bias[e]; groups of experts / n_group ranked by the sum of their two best
  // choice scores (the best alone in groups of one), the topk_group best kept;
  // the top_k choice scores among the kept groups' experts (ties to the lower
  // id); weights the chosen scores, divided by their sum + 1e-20 when
  // norm_topk_prob, times routed_scaling_factor.
  kSigmoidGroupTopK = 2,
};

// For a batch of n_rows rows (tokens), with k = top_k:
//   choice: row r picks experts E_r = {e_r0, ..., e_r(k-1)} (distinct) and
//   weights w_rj as `kind` says.
//   rows/weights [n_rows * k]: the n_rows * k entries (r, e, w) ordered by
//     ascending e, then ascending r; rows[i] = r, weights[i] = w.
//   offsets [experts + 1]: expert e's entries are [offsets[e], offsets[e+1]);
//     offsets[0] = 0, offsets[experts] = n_rows * k.
//   slots [n_rows, k]: row r's entry positions, ascending (so in ascending
//     expert order).
//   shared_gate (Qwen): the logits have one more column, the shared expert's
//     gate, and rows/weights continue past n_rows * k with one entry per row:
//     rows[n_rows * k + r] = r, weights[...] = 1 / (1 + exp(-gate logit)).
// Every backend gives the same entries and offsets; weights are fp32 values
// from exp (expf), so a GPU's may differ from the CPU's in the last bits (the
// CUDA emulator gives the CPU's bits), and kSoftmaxTopK's exact ties as noted.
struct MoeRouteParams {
  const float* logits = nullptr;  // [n_rows, logit_stride]
  const float* bias = nullptr;    // [experts], kSigmoidGroupTopK only; null: no bias
  int32_t* rows = nullptr;        // [n_rows * top_k (+ n_rows with shared_gate)]
  float* weights = nullptr;       // as rows
  int32_t* offsets = nullptr;     // [experts + 1]; written even when n_rows == 0
  int32_t* slots = nullptr;       // [n_rows, top_k]
  int64_t n_rows = 0;
  int64_t experts = 0;
  int64_t top_k = 0;
  int64_t logit_stride = 0;  // 0: experts (+ 1 with shared_gate)
  MoeRouterKind kind = MoeRouterKind::kTopKSoftmax;
  int64_t n_group = 1;     // kSigmoidGroupTopK: experts % n_group == 0
  int64_t topk_group = 1;  // kSigmoidGroupTopK: 1 <= topk_group <= n_group
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  bool shared_gate = false;
};

// Offsets and entry positions are int32.
constexpr int64_t kMaxMoeEntries = std::numeric_limits<int32_t>::max() / 2;
// One MoeRoute call routes at most this many entries (n_rows * top_k): the
// CUDA backend keeps each row's choice in its 1 MiB launch workspace (8 bytes
// an entry) before grouping. The engine routes longer prefills in pieces.
constexpr int64_t kMaxMoeRouteEntries = 65536;
// kSigmoidGroupTopK: at most this many groups (a row's group scores are held
// in registers on the CUDA backend).
constexpr int64_t kMaxMoeGroups = 32;

// kKernelInvalidArgument for a negative n_rows, no experts, top_k outside
// [1, experts], a stride below the logits' columns, a group layout that
// cannot hold top_k experts or more than kMaxMoeGroups groups
// (kSigmoidGroupTopK), a non-finite scaling factor, more entries than
// kMaxMoeRouteEntries, a null offsets, or (n_rows > 0) a null logits, rows,
// weights or slots.
inline KernelStatus CheckMoeRouteParams(const MoeRouteParams& p) {
  if (p.n_rows < 0 || p.experts < 1 || p.experts > kMaxMoeEntries || p.top_k < 1 || p.top_k > p.experts) {
    return kKernelInvalidArgument;
  }
  const int64_t columns = p.experts + (p.shared_gate ? 1 : 0);
  if (p.logit_stride != 0 && p.logit_stride < columns) return kKernelInvalidArgument;
  if (p.kind == MoeRouterKind::kSigmoidGroupTopK) {
    if (p.n_group < 1 || p.n_group > kMaxMoeGroups || p.experts % p.n_group != 0 || p.topk_group < 1 ||
        p.topk_group > p.n_group || p.top_k > p.topk_group * (p.experts / p.n_group)) {
      return kKernelInvalidArgument;
    }
  } else if (p.kind != MoeRouterKind::kTopKSoftmax && p.kind != MoeRouterKind::kSoftmaxTopK) {
    return kKernelInvalidArgument;
  }
  if (!(p.routed_scaling_factor == p.routed_scaling_factor) ||
      p.routed_scaling_factor == std::numeric_limits<float>::infinity() ||
      p.routed_scaling_factor == -std::numeric_limits<float>::infinity()) {
    return kKernelInvalidArgument;
  }
  if (p.n_rows > kMaxMoeRouteEntries || p.n_rows * p.top_k > kMaxMoeRouteEntries) return kKernelInvalidArgument;
  if (p.offsets == nullptr) return kKernelInvalidArgument;
  if (p.n_rows > 0 && (p.logits == nullptr || p.rows == nullptr || p.weights == nullptr || p.slots == nullptr)) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

// For each expert e in [0, experts), with first = offsets[e] and count =
// offsets[e + 1] - first: rows [first, first + count) of out = those rows of
// a @ w_e^T, where w_e is rows [e * n, (e + 1) * n) of w (one stacked weight
// of every expert, fp32 or bf16): the bits Matmul gives for that item. The
// CPU backend gives the bits of Matmul in the call's mode; the CUDA backend
// runs its deterministic kernel in both modes (cuBLAS would need the counts
// on the host). Rows at or past offsets[experts] are not written.
//
// The offsets are device memory; they must be non-decreasing from
// offsets[0] = 0 with no expert holding more than max_rows rows and
// offsets[experts] <= rows (MoeRoute's are). The CPU backend checks this
// (kKernelInvalidArgument, nothing written); the CUDA kernel clamps each
// expert's range into [0, rows) and to max_rows rows instead of reading
// outside the buffers.
struct ExpertMatmulParams {
  const float* a = nullptr;          // [rows, k], row stride lda: the rows grouped by expert
  const int32_t* offsets = nullptr;  // [experts + 1]
  const float* w = nullptr;          // [experts * n, k], row stride ldw
  const uint16_t* w_bf16 = nullptr;  // [experts * n, k], row stride ldw (exactly one of w, w_bf16)
  float* out = nullptr;              // [rows, n], row stride ldo; overlaps no input
  int64_t experts = 0;
  int64_t rows = 0;      // rows of a and out
  int64_t max_rows = 0;  // at most this many rows per expert (a batch's tokens); <= rows
  int64_t n = 0;         // columns per expert
  int64_t k = 0;
  int64_t lda = 0;  // 0: k
  int64_t ldw = 0;  // 0: k
  int64_t ldo = 0;  // 0: n
};

inline KernelStatus CheckExpertMatmulParams(const ExpertMatmulParams& p) {
  if (p.experts < 1 || p.rows < 0 || p.max_rows < 0 || p.max_rows > p.rows || p.n < 0 || p.k < 0) {
    return kKernelInvalidArgument;
  }
  if (p.rows > kMaxMoeEntries || p.offsets == nullptr || (p.w == nullptr) == (p.w_bf16 == nullptr)) {
    return kKernelInvalidArgument;
  }
  if (p.rows > 0 && (p.a == nullptr || p.out == nullptr)) return kKernelInvalidArgument;
  const int64_t lda = p.lda ? p.lda : p.k;
  const int64_t ldw = p.ldw ? p.ldw : p.k;
  const int64_t ldo = p.ldo ? p.ldo : p.n;
  if (p.lda < 0 || p.ldw < 0 || p.ldo < 0 || lda < p.k || ldw < p.k || ldo < p.n) return kKernelInvalidArgument;
  return kKernelOk;
}

// Expert e's item of an ExpertMatmul, its rows [first, first + count) as
// the host reads them from the offsets: the Matmul whose bits those rows get
// (for backends that issue the experts as separate matmuls).
inline MatmulParams ExpertMatmulItem(const ExpertMatmulParams& p, int64_t e, int64_t first, int64_t count) {
  MatmulParams item;
  item.lda = p.lda ? p.lda : p.k;
  item.ldw = p.ldw ? p.ldw : p.k;
  item.ldo = p.ldo ? p.ldo : p.n;
  item.a = p.a + first * item.lda;
  if (p.w != nullptr) item.w = p.w + e * p.n * item.ldw;
  if (p.w_bf16 != nullptr) item.w_bf16 = p.w_bf16 + e * p.n * item.ldw;
  item.out = p.out + first * item.ldo;
  item.m = count;
  item.n = p.n;
  item.k = p.k;
  return item;
}

// For r in [0, n_rows), c in [0, dim), j = 0, 1, ..., per_row - 1 in turn,
// with s = slots[r * per_row + j]:
//   out[r, c] = out[r, c] + x[s, c] * weights[s]
// each operation rounded to fp32, never contracted into an FMA: the bits of
// ScatterAddRows (alpha 1) issued expert by expert in ascending order, which
// is what MoeRoute's slots give. Every backend gives the same bits. Slot
// values must lie in [0, rows of x) (not checked).
struct MoeCombineParams {
  const float* x = nullptr;        // [*, dim], row stride x_row_stride
  const int32_t* slots = nullptr;  // [n_rows, per_row]
  const float* weights = nullptr;  // [rows of x]
  float* out = nullptr;            // [n_rows, dim], row stride out_row_stride; read and written; overlaps no input
  int64_t n_rows = 0;
  int64_t per_row = 0;
  int64_t dim = 0;
  int64_t x_row_stride = 0;    // 0: dim; else >= dim
  int64_t out_row_stride = 0;  // 0: dim; else >= dim
};

inline KernelStatus CheckMoeCombineParams(const MoeCombineParams& p) {
  if (p.n_rows < 0 || p.per_row < 0 || p.dim < 0 || p.x_row_stride < 0 || p.out_row_stride < 0) {
    return kKernelInvalidArgument;
  }
  if ((p.x_row_stride != 0 && p.x_row_stride < p.dim) || (p.out_row_stride != 0 && p.out_row_stride < p.dim)) {
    return kKernelInvalidArgument;
  }
  if (p.n_rows > 0 && p.per_row > 0 &&
      (p.x == nullptr || p.slots == nullptr || p.weights == nullptr || p.out == nullptr)) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_MOE_PARAMS_H_
