#ifndef HYBRIDSERVE_KERNELS_TORCH_TOPK_H_
#define HYBRIDSERVE_KERNELS_TORCH_TOPK_H_

// torch.topk(p, k, largest=True, sorted=True)'s indices as PyTorch computes
// them on the CPU (ATen's TopKImpl.h: the same algorithm, comparator and input
// order, so the same choice among ties): the routers that pick experts by it
// (Qwen3-Next / Qwen3.5-MoE) choose what transformers chooses. Host code,
// used by the engine's MoE runner on every backend and by the CPU reference
// block (cpu/qwen_moe_block.h).

#include <cstdint>

namespace hybridserve::kernels {

// out [k] for p [n], 1 <= k <= n: the k largest, largest first.
void TorchTopKIndices(const float* p, int64_t n, int64_t k, int32_t* out);

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_TORCH_TOPK_H_
