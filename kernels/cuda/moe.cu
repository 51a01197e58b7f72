// MoeRoute on the GPU (semantics: kernels/moe_params.h; the CPU's
// kernels/cpu/moe.cc is the reference). Two launches, both recordable in a
// graph:
//   ChooseKernel  one thread per row: the row's top_k experts and weights,
//                 in the router's rank order, into the launch workspace
//                 (ids [n * k] int32, then weights [n * k] fp32), and the
//                 shared expert's gate entry;
//   GroupKernel   one block: per-expert counts and offsets, the entries
//                 placed by ascending expert then ascending row, each row's
//                 slots sorted.
// A row's choice is made by k passes of "the best expert ranked after the
// previous pick" under a strict total order (NaN first, then larger value,
// then lower expert id), so the picks are the CPU's except where the CPU
// follows torch.topk among exact ties (kSoftmaxTopK). Values are computed
// with the CPU's operations in its order (expf, fp32, sums in ascending
// expert or pick order; no product feeds a sum, so nothing can be contracted
// into an FMA), so the emulator gives the CPU's bits and a GPU differs only
// by its expf.
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launchers.h"

namespace hybridserve::kernels::HS_CUDA_NS {
namespace {

constexpr int kChooseThreads = 128;
constexpr int kGroupThreads = 256;

struct ChooseArgs {
  const float* logits;
  const float* bias;
  int32_t* ids;    // [n * k] workspace
  float* chosen;   // [n * k] workspace
  int32_t* rows;   // shared gate entries at [n * k, n * k + n)
  float* weights;  // as rows
  int64_t n, experts, k, stride;
  MoeRouterKind kind;
  int64_t n_group, topk_group;
  bool norm_topk_prob;
  float scale;
  bool shared_gate;
};

// Whether (va, a) ranks before (vb, b).
__device__ __forceinline__ bool Before(float va, int64_t a, float vb, int64_t b) {
  const bool na = va != va;
  const bool nb = vb != vb;
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return a < b;
}

__device__ __forceinline__ float SigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }

// The value a row ranks expert e by.
struct RowValues {
  const ChooseArgs* a;
  const float* l;
  float top;    // kSoftmaxTopK: the largest logit
  float total;  // kSoftmaxTopK: the sum of exp(l - top)
  __device__ __forceinline__ float Prob(int64_t e) const { return expf(l[e] - top) / total; }
  __device__ __forceinline__ float Score(int64_t e) const { return SigmoidF(l[e]); }
  __device__ __forceinline__ float Choice(int64_t e) const {
    return __fadd_rn(Score(e), a->bias != nullptr ? a->bias[e] : 0.0f);
  }
  __device__ __forceinline__ float Rank(int64_t e) const {
    switch (a->kind) {
      case MoeRouterKind::kTopKSoftmax:
        return l[e];
      case MoeRouterKind::kSoftmaxTopK:
        return Prob(e);
      case MoeRouterKind::kSigmoidGroupTopK:
        return Choice(e);
    }
    return 0.0f;
  }
};

__global__ void __launch_bounds__(kChooseThreads) ChooseKernel(ChooseArgs a) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < a.n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    RowValues v{&a, a.logits + r * a.stride, 0.0f, 0.0f};
    if (a.kind == MoeRouterKind::kSoftmaxTopK) {
      // The CPU's std::max_element (the first largest) and its ascending sum.
      float top = v.l[0];
      for (int64_t e = 1; e < a.experts; ++e) {
        if (top < v.l[e]) top = v.l[e];
      }
      v.top = top;
      float total = 0.0f;
      for (int64_t e = 0; e < a.experts; ++e) total = total + expf(v.l[e] - top);
      v.total = total;
    }
    // kSigmoidGroupTopK: which groups are kept.
    bool kept[kMaxMoeGroups] = {};
    const int64_t per_group = a.experts / a.n_group;
    if (a.kind == MoeRouterKind::kSigmoidGroupTopK) {
      float group_score[kMaxMoeGroups];
      for (int64_t g = 0; g < a.n_group; ++g) {
        float best = -INFINITY;
        float second = -INFINITY;
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
          const float c = v.Choice(e);
          if (c > best) {
            second = best;
            best = c;
          } else if (c > second) {
            second = c;
          }
        }
        group_score[g] = per_group >= 2 ? __fadd_rn(best, second) : best;
      }
      for (int64_t g = 0; g < a.n_group; ++g) {
        int64_t ahead = 0;
        for (int64_t h = 0; h < a.n_group; ++h) ahead += Before(group_score[h], h, group_score[g], g) ? 1 : 0;
        kept[g] = ahead < a.topk_group;
      }
    }
    int32_t* ids = a.ids + r * a.k;
    float* w = a.chosen + r * a.k;
    int64_t prev = -1;
    float prev_v = 0.0f;
    float total = 0.0f;
    for (int64_t j = 0; j < a.k; ++j) {
      int64_t best = -1;
      float best_v = 0.0f;
      for (int64_t e = 0; e < a.experts; ++e) {
        if (a.kind == MoeRouterKind::kSigmoidGroupTopK && !kept[e / per_group]) continue;
        const float x = v.Rank(e);
        if (prev >= 0 && !Before(prev_v, prev, x, e)) continue;
        if (best < 0 || Before(x, e, best_v, best)) {
          best = e;
          best_v = x;
        }
      }
      prev = best;
      prev_v = best_v;
      ids[j] = static_cast<int32_t>(best);
      switch (a.kind) {
        case MoeRouterKind::kTopKSoftmax:
          // exp(l - the first pick's logit), normalised below.
          w[j] = expf(best_v - (j == 0 ? best_v : v.l[ids[0]]));
          break;
        case MoeRouterKind::kSoftmaxTopK:
          w[j] = best_v;
          break;
        case MoeRouterKind::kSigmoidGroupTopK:
          w[j] = v.Score(best);
          break;
      }
      total = __fadd_rn(total, w[j]);
    }
    for (int64_t j = 0; j < a.k; ++j) {
      switch (a.kind) {
        case MoeRouterKind::kTopKSoftmax:
          w[j] = w[j] / total;
          break;
        case MoeRouterKind::kSoftmaxTopK:
          if (a.norm_topk_prob) w[j] = w[j] / total;
          break;
        case MoeRouterKind::kSigmoidGroupTopK:
          if (a.norm_topk_prob) w[j] = w[j] / (total + 1e-20f);
          w[j] = __fmul_rn(w[j], a.scale);
          break;
      }
    }
    if (a.shared_gate) {
      a.rows[a.n * a.k + r] = static_cast<int32_t>(r);
      a.weights[a.n * a.k + r] = SigmoidF(v.l[a.experts]);
    }
  }
}

struct GroupArgs {
  const int32_t* ids;
  const float* chosen;
  int32_t* rows;
  float* weights;
  int32_t* offsets;
  int32_t* slots;
  int64_t n, experts, k;
};

__global__ void __launch_bounds__(kGroupThreads) GroupKernel(GroupArgs a) {
  const int64_t entries = a.n * a.k;
  for (int64_t e = threadIdx.x; e < a.experts; e += blockDim.x) {
    int32_t count = 0;
    for (int64_t i = 0; i < entries; ++i) count += a.ids[i] == e ? 1 : 0;
    a.offsets[e + 1] = count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    a.offsets[0] = 0;
    for (int64_t e = 0; e < a.experts; ++e) a.offsets[e + 1] += a.offsets[e];
  }
  __syncthreads();
  // Entry i = r * k + j goes to the next place of its expert: rows ascending.
  for (int64_t e = threadIdx.x; e < a.experts; e += blockDim.x) {
    int32_t at = a.offsets[e];
    for (int64_t i = 0; i < entries; ++i) {
      if (a.ids[i] != e) continue;
      a.rows[at] = static_cast<int32_t>(i / a.k);
      a.weights[at] = a.chosen[i];
      a.slots[i] = at;
      ++at;
    }
  }
  __syncthreads();
  for (int64_t r = threadIdx.x; r < a.n; r += blockDim.x) {
    int32_t* s = a.slots + r * a.k;
    for (int64_t j = 1; j < a.k; ++j) {
      const int32_t x = s[j];
      int64_t i = j;
      for (; i > 0 && s[i - 1] > x; --i) s[i] = s[i - 1];
      s[i] = x;
    }
  }
}

}  // namespace

int MoeRoute(const MoeRouteParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckMoeRouteParams(p); status != kKernelOk) return status;
  const int64_t entries = p.n_rows * p.top_k;
  if (ctx.workspace == nullptr ||
      ctx.workspace_bytes < entries * static_cast<int64_t>(sizeof(int32_t) + sizeof(float))) {
    return kKernelUnsupported;
  }
  int32_t* ids = static_cast<int32_t*>(ctx.workspace);
  float* chosen = reinterpret_cast<float*>(ids + entries);
  if (p.n_rows > 0) {
    ChooseArgs c{};
    c.logits = p.logits;
    c.bias = p.kind == MoeRouterKind::kSigmoidGroupTopK ? p.bias : nullptr;
    c.ids = ids;
    c.chosen = chosen;
    c.rows = p.rows;
    c.weights = p.weights;
    c.n = p.n_rows;
    c.experts = p.experts;
    c.k = p.top_k;
    c.stride = p.logit_stride ? p.logit_stride : p.experts + (p.shared_gate ? 1 : 0);
    c.kind = p.kind;
    c.n_group = p.kind == MoeRouterKind::kSigmoidGroupTopK ? p.n_group : 1;
    c.topk_group = p.topk_group;
    c.norm_topk_prob = p.norm_topk_prob;
    c.scale = p.routed_scaling_factor;
    c.shared_gate = p.shared_gate;
    const int64_t blocks = CeilDiv(p.n_rows, kChooseThreads);
    const int status = LaunchStatus(
        Launch(ChooseKernel, dim3(static_cast<unsigned int>(blocks)), dim3(kChooseThreads), 0, ctx.stream, c));
    if (status != kKernelOk) return status;
  }
  GroupArgs g{};
  g.ids = ids;
  g.chosen = chosen;
  g.rows = p.rows;
  g.weights = p.weights;
  g.offsets = p.offsets;
  g.slots = p.slots;
  g.n = p.n_rows;
  g.experts = p.experts;
  g.k = p.top_k;
  return LaunchStatus(Launch(GroupKernel, dim3(1), dim3(kGroupThreads), 0, ctx.stream, g));
}

}  // namespace hybridserve::kernels::HS_CUDA_NS
