// SSD chunk scan vs the token-by-token scan at prefill shapes, same run
// (interleaved, best of many runs).
//   bazel run -c opt //bench/kernels:ssd_scan_bench [-- threads]

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "kernels/cpu/ssd_scan.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ssd_params.h"

namespace hybridserve {
namespace {

using kernels::SsdChunkScanParams;
using kernels::cpu::SsdChunkScan;
using kernels::cpu::SsdSequentialScan;
using kernels::cpu::ThreadPool;

struct Config {
  int64_t seqlen, n_heads, head_dim, d_state, n_groups, chunk_size, block_size;
};

void Run(const Config& c, ThreadPool* pool) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](int64_t n, float scale) {
    std::vector<float> v(n);
    for (float& f : v) f = scale * u(rng);
    return v;
  };
  const std::vector<float> x = fill(c.seqlen * c.n_heads * c.head_dim, 1.0f);
  const std::vector<float> B = fill(c.seqlen * c.n_groups * c.d_state, 1.0f);
  const std::vector<float> C = fill(c.seqlen * c.n_groups * c.d_state, 1.0f);
  std::vector<float> dt = fill(c.seqlen * c.n_heads, 1.0f);
  for (float& v : dt) v = 0.001f + 0.05f * (v + 1.0f);
  std::vector<float> A = fill(c.n_heads, 1.0f);
  for (float& v : A) v = -1.0f - 7.0f * (v + 1.0f);
  const std::vector<float> D = fill(c.n_heads, 1.0f);
  std::vector<float> y(x.size()), final_state(c.n_heads * c.head_dim * c.d_state);
  std::vector<float> chunk_states(kernels::SsdNumChunkStates(0, c.seqlen, c.chunk_size) * final_state.size());

  SsdChunkScanParams p;
  p.x = x.data();
  p.dt = dt.data();
  p.A = A.data();
  p.B = B.data();
  p.C = C.data();
  p.D = D.data();
  p.y = y.data();
  p.final_state = final_state.data();
  p.chunk_states = chunk_states.data();
  p.seqlen = c.seqlen;
  p.n_heads = c.n_heads;
  p.head_dim = c.head_dim;
  p.d_state = c.d_state;
  p.n_groups = c.n_groups;
  p.chunk_size = c.chunk_size;
  p.block_size = c.block_size;

  const std::vector<double> t = bench::BestSecondsInterleaved(
      {[&] { SsdSequentialScan(p, pool); }, [&] { SsdChunkScan(p, pool); }}, /*budget_s=*/3.0);
  const double t_seq = t[0], t_chunk = t[1];
  std::printf(
      "seqlen %4lld heads %3lld head_dim %3lld d_state %3lld groups %2lld chunk %3lld block %3lld"
      " threads %d | sequential %8.2f ms  chunk %8.2f ms  speedup %.2fx\n",
      static_cast<long long>(c.seqlen), static_cast<long long>(c.n_heads), static_cast<long long>(c.head_dim),
      static_cast<long long>(c.d_state), static_cast<long long>(c.n_groups), static_cast<long long>(c.chunk_size),
      static_cast<long long>(kernels::cpu::SsdResolvedBlockSize(p)), pool->num_threads(), t_seq * 1e3, t_chunk * 1e3,
      t_seq / t_chunk);
}

}  // namespace
}  // namespace hybridserve

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  hybridserve::kernels::cpu::ThreadPool pool(threads);
  using hybridserve::Config;
  const Config configs[] = {
      // Nemotron-H-like mixer geometry (head_dim 64, d_state 128), 2K tokens.
      {2048, 32, 64, 128, 8, 128, 0},
      {2048, 32, 64, 128, 1, 128, 0},
      {2048, 24, 64, 128, 8, 256, 0},
      // Same with block = chunk (no sub-blocking), for comparison.
      {2048, 32, 64, 128, 8, 128, 128},
      {2048, 32, 64, 128, 8, 128, 64},
      {2048, 32, 64, 128, 8, 128, 16},
  };
  for (const Config& c : configs) hybridserve::Run(c, &pool);
  return 0;
}
