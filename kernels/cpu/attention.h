#ifndef HYBRIDSERVE_KERNELS_CPU_ATTENTION_H_
#define HYBRIDSERVE_KERNELS_CPU_ATTENTION_H_

#include "kernels/attention_params.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"

namespace hybridserve::kernels::cpu {

// Paged-KV causal attention with grouped-query heads (see
// kernels/attention_params.h). Every query row runs one arithmetic, shared by
// prefill and decode:
//   for each key block b = 0, 1, ... (the keys of logical page b, up to the
//   query's position), in order:
//     s_i = hsum of q.k_i in 4 x 8-lane fma accumulators (fixed tree), times scale
//     m' = max(m, max_i s_i);  alpha = exp(m - m');  p_i = exp(s_i - m')   (simd::Exp)
//     l = l * alpha, then l += p_i in key order
//     acc = acc * alpha, then acc = fma(p_i, v_i, acc) in key order
//   out = acc / l
// so outputs never depend on the batch, on other queries, on where a prefill
// segment started, on physical page placement or on threads.
// Return a KernelStatus; page indices are checked against cache.num_pages.
int KvAppend(const KvAppendParams& p, ThreadPool* pool);
int KvAppendDecode(const KvAppendDecodeParams& p, ThreadPool* pool);
int AttentionPrefill(const AttentionPrefillParams& p, ThreadPool* pool);
int AttentionDecode(const AttentionDecodeParams& p, ThreadPool* pool);
// The same on a given instruction-set path (tests: every path gives the
// bits of the avx2 one); `path` must be one this CPU has (DetectedKernelPath).
int AttentionPrefillOnPath(const AttentionPrefillParams& p, KernelPath path, ThreadPool* pool);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_ATTENTION_H_
