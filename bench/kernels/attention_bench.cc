// Prefill attention over a paged KV cache (kernels/cpu/attention.h) at the
// bench model's shape (8 query heads, 2 KV heads, head_dim 128, pages of 16
// tokens), against the two OpenBLAS sgemm calls it contains, same run
// (interleaved, best of many): per KV head, scores = Q K^T over every key and
// out = P V, on contiguous K and V, without the causal mask, the softmax or
// the pages. "x gemm" is the GEMM pair's time over ours (1.00: attention at
// the speed of a plain GEMM of its FLOPs). Cases: a resumed turn (65 new
// tokens after 4K and 16K of history) and a prompt from the start.
//   bazel run -c opt //bench/kernels:attention_bench [-- threads]

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"

namespace hybridserve {
namespace {

constexpr int64_t kHeads = 8, kKvHeads = 2, kHeadDim = 128, kPageSize = 16;

void Run(int64_t history, int64_t tokens, kernels::cpu::ThreadPool* pool) {
  const int64_t keys = history + tokens;
  const int64_t pages = (keys + kPageSize - 1) / kPageSize;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> k(pages * kPageSize * kKvHeads * kHeadDim), v(k.size());
  std::vector<float> q(tokens * kHeads * kHeadDim), out(q.size());
  for (float& f : k) f = u(rng);
  for (float& f : v) f = u(rng);
  for (float& f : q) f = u(rng);
  // Pages in a shuffled order, as a pool hands them out.
  std::vector<int32_t> table(pages);
  for (int64_t i = 0; i < pages; ++i) table[i] = static_cast<int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng);

  kernels::AttentionPrefillParams p;
  p.cache = kernels::PagedKvCache{k.data(), v.data(), pages, kPageSize, kKvHeads, kHeadDim};
  p.q = q.data();
  p.out = out.data();
  p.block_table = table.data();
  p.start_pos = history;
  p.n_tokens = tokens;
  p.n_heads = kHeads;

  // The GEMM pair of each KV head on contiguous operands.
  const int64_t rows = tokens * (kHeads / kKvHeads);
  std::vector<float> qg(rows * kHeadDim), kc(keys * kHeadDim), vc(keys * kHeadDim), s(rows * keys), o(rows * kHeadDim);
  for (float& f : qg) f = u(rng);
  for (float& f : kc) f = u(rng);
  for (float& f : vc) f = u(rng);
  auto gemms = [&] {
    for (int64_t h = 0; h < kKvHeads; ++h) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, kHeadDim, 1.0f, qg.data(), kHeadDim, kc.data(),
                  kHeadDim, 0.0f, s.data(), keys);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, kHeadDim, keys, 1.0f, s.data(), keys, vc.data(),
                  kHeadDim, 0.0f, o.data(), kHeadDim);
    }
  };
  const std::vector<double> t =
      bench::BestSecondsInterleaved({[&] { (void)kernels::cpu::AttentionPrefill(p, pool); }, gemms}, /*budget_s=*/2.0);
  // FLOPs of the causal product: each new token attends history + its own position.
  double scored = 0;
  for (int64_t i = 0; i < tokens; ++i) scored += static_cast<double>(history + i + 1);
  const double flops = 4.0 * scored * kHeads * kHeadDim;
  const double gemm_flops = 4.0 * rows * keys * kHeadDim * kKvHeads;
  std::printf(
      "history %6lld + %4lld tokens | attention %7.2f ms, %6.1f GFLOP/s | gemm pair %7.2f ms, %6.1f GFLOP/s | "
      "%.2fx gemm\n",
      static_cast<long long>(history), static_cast<long long>(tokens), t[0] * 1e3, flops / t[0] * 1e-9, t[1] * 1e3,
      gemm_flops / t[1] * 1e-9, (t[1] * flops / gemm_flops) / t[0]);
}

}  // namespace
}  // namespace hybridserve

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  openblas_set_num_threads(threads);
  hybridserve::kernels::cpu::ThreadPool pool(threads);
  std::printf("threads %d, kernel path %s; 8 heads, 2 KV heads, head_dim 128, pages of 16\n", threads,
              hybridserve::kernels::cpu::KernelPathName(hybridserve::kernels::cpu::ActiveKernelPath()));
  hybridserve::Run(4096, 65, &pool);
  hybridserve::Run(16384, 65, &pool);
  hybridserve::Run(0, 2048, &pool);
  return 0;
}
