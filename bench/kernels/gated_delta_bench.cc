// Gated DeltaNet prefill on the CPU: the chunked rule (the CPU backend's
// GatedDeltaPrefill) vs the token-by-token oracle at Qwen3-Next / Qwen3.5
// layer shapes, same run (interleaved, best of many runs), with the chunked
// rule's arithmetic rate.
//   bazel run -c opt //bench/kernels:gated_delta_bench [-- threads]

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/gated_delta_params.h"

namespace hybridserve {
namespace {

using kernels::GatedDeltaParams;
using kernels::cpu::ThreadPool;

struct Config {
  int64_t seqlen, n_k_heads, n_v_heads, dk, dv, chunk_size;
};

// Multiply-adds of the chunked rule per value head and chunk of L tokens:
// A and QK (L^2 dk), the solve (L^2 (dk + dv) / 2), vnew, the inter-chunk read
// and the state update (3 L dk dv), the intra-chunk output (L^2 dv / 2).
double ChunkedFlops(const Config& c) {
  const double L = static_cast<double>(c.chunk_size), dk = c.dk, dv = c.dv;
  const double per_chunk = L * L * dk + L * L * (dk + dv) / 2 + 3 * L * dk * dv + L * L * dv / 2;
  return 2.0 * per_chunk * (static_cast<double>(c.seqlen) / L) * c.n_v_heads;
}

void Run(const Config& c, ThreadPool* pool) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](int64_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& f : v) f = lo + (hi - lo) * 0.5f * (u(rng) + 1.0f);
    return v;
  };
  const std::vector<float> q = fill(c.seqlen * c.n_k_heads * c.dk, -1, 1),
                           k = fill(c.seqlen * c.n_k_heads * c.dk, -1, 1),
                           v = fill(c.seqlen * c.n_v_heads * c.dv, -1, 1), g = fill(c.seqlen * c.n_v_heads, -1, 0),
                           beta = fill(c.seqlen * c.n_v_heads, 0, 1);
  std::vector<float> o(c.seqlen * c.n_v_heads * c.dv), state(c.n_v_heads * c.dk * c.dv);
  GatedDeltaParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.g = g.data();
  p.beta = beta.data();
  p.o = o.data();
  p.final_state = state.data();
  p.seqlen = c.seqlen;
  p.n_k_heads = c.n_k_heads;
  p.n_v_heads = c.n_v_heads;
  p.dk = c.dk;
  p.dv = c.dv;
  p.chunk_size = c.chunk_size;
  const std::vector<double> t = bench::BestSecondsInterleaved(
      {[&] { kernels::cpu::GatedDeltaSequential(p); }, [&] { kernels::cpu::GatedDeltaChunked(p, nullptr, pool); }},
      /*budget_s=*/4.0, /*min_rounds=*/2);
  std::printf(
      "seqlen %5lld k_heads %2lld v_heads %2lld dk %3lld dv %3lld chunk %3lld threads %d | oracle (1 thread) %9.2f ms"
      "  chunked %9.2f ms  %.2f GFLOP/s  speedup %.2fx\n",
      static_cast<long long>(c.seqlen), static_cast<long long>(c.n_k_heads), static_cast<long long>(c.n_v_heads),
      static_cast<long long>(c.dk), static_cast<long long>(c.dv), static_cast<long long>(c.chunk_size),
      pool->num_threads(), t[0] * 1e3, t[1] * 1e3, ChunkedFlops(c) / t[1] * 1e-9, t[0] / t[1]);
}

}  // namespace
}  // namespace hybridserve

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  hybridserve::kernels::cpu::ThreadPool pool(threads);
  using hybridserve::Config;
  const Config configs[] = {
      // Qwen3-Next-80B-A3B's linear attention: 16 key heads, 32 value heads, 128 x 128.
      {1024, 16, 32, 128, 128, 64},
      {4096, 16, 32, 128, 128, 64},
      // A small hybrid's layer (the e2e models' scale).
      {2048, 2, 4, 64, 64, 64},
  };
  for (const Config& c : configs) hybridserve::Run(c, &pool);
  return 0;
}
