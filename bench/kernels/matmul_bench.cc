// Deterministic matmul at decode and prefill shapes, same run (interleaved,
// best of many runs), each dtype against a baseline of its own kind:
//   fp32 weights: OpenBLAS sgemm/sgemv on the same operands;
//   bf16 weights: the fp32 deterministic matmul on the widened weights (what
//     bf16 storage saves), and, where the call is bound by reading the weights
//     (m <= 8), a streaming read of the same weight bytes with the same threads
//     (the bandwidth floor: 1.00 means the matmul runs at the speed of its
//     reads). OpenBLAS 0.3.21 has no bf16 GEMM (no sbgemm in Debian's build).
// Then decode from memory: m = 1 and 4 rows against bf16 and fp32 weights of
// 256 MiB in all (past any cache), against a streaming read of the same bytes.
// Prints the kernel path (cpu_features.h) the run used.
//   bazel run -c opt //bench/kernels:matmul_bench [-- threads]

#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul_params.h"

namespace hybridserve {
namespace {

using kernels::MatmulMode;
using kernels::MatmulParams;
using kernels::cpu::Matmul;
using kernels::cpu::ThreadPool;

uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// Reads `bytes` bytes (as 32-bit words) split over the pool's threads; the
// sum keeps the reads.
uint32_t StreamRead(const uint16_t* data, int64_t elements, ThreadPool* pool) {
  std::vector<uint32_t> sums(64, 0);
  kernels::cpu::ParallelFor(pool, 64, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      const auto* words = reinterpret_cast<const uint32_t*>(data + elements * part / 64 / 16 * 16);
      const int64_t count = (elements * (part + 1) / 64 / 16 * 16 - elements * part / 64 / 16 * 16) / 2;
      uint32_t s = 0;
      for (int64_t i = 0; i < count; ++i) s ^= words[i];
      sums[part] = s;
    }
  });
  uint32_t total = 0;
  for (uint32_t s : sums) total ^= s;
  return total;
}

void Run(int64_t m, int64_t n, int64_t k, ThreadPool* pool) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(m * k), w(n * k), out(m * n);
  for (float& f : a) f = u(rng);
  for (float& f : w) f = 0.05f * u(rng);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = ToBf16(w[i]);

  MatmulParams p;
  p.a = a.data();
  p.w = w.data();
  p.out = out.data();
  p.m = m;
  p.n = n;
  p.k = k;
  MatmulParams p16 = p;
  p16.w = nullptr;
  p16.w_bf16 = w16.data();

  volatile uint32_t sink = 0;
  const std::vector<double> t = bench::BestSecondsInterleaved(
      {[&] { Matmul(p, MatmulMode::kFast, pool); }, [&] { Matmul(p, MatmulMode::kDeterministic, pool); },
       [&] { Matmul(p16, MatmulMode::kDeterministic, pool); },
       [&] { sink = sink + StreamRead(w16.data(), n * k, pool); }},
      /*budget_s=*/1.0);
  const double t_blas = t[0], t_det = t[1], t_det16 = t[2], t_read16 = t[3];
  const double flops = 2.0 * m * n * k;
  std::printf("m %4lld n %5lld k %5lld | fp32: deterministic %6.1f GFLOP/s, %.2fx openblas (%6.1f) | ",
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), flops / t_det * 1e-9,
              t_blas / t_det, flops / t_blas * 1e-9);
  std::printf("bf16: %6.1f GFLOP/s, %.2fx fp32 deterministic", flops / t_det16 * 1e-9, t_det / t_det16);
  if (m <= 8) std::printf(", %.2fx a read of its %.1f MB", t_read16 / t_det16, n * k * 2 / 1e6);
  std::printf("\n");
}

// Decode from memory: m rows against `copies` distinct [n, k] bf16 and fp32
// weight matrices of 256 MiB in all (far past any cache), one matrix after
// another as a model's layers run, against a streaming read of the same
// bytes with the same threads. Best of a few passes.
void RunFromMemory(int64_t m, int64_t n, int64_t k, ThreadPool* pool) {
  for (const int bytes : {2, 4}) {
    const int64_t copies = (int64_t{256} << 20) / (n * k * bytes);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> a(m * k), out(m * n);
    for (float& f : a) f = u(rng);
    std::vector<uint16_t> w16(bytes == 2 ? copies * n * k : 0);
    std::vector<float> w32(bytes == 4 ? copies * n * k : 0);
    for (uint16_t& x : w16) x = ToBf16(0.05f * u(rng));
    for (float& x : w32) x = 0.05f * u(rng);
    MatmulParams p;
    p.a = a.data();
    p.out = out.data();
    p.m = m;
    p.n = n;
    p.k = k;
    volatile uint32_t sink = 0;
    const std::vector<double> t = bench::BestSecondsInterleaved(
        {[&] {
           for (int64_t c = 0; c < copies; ++c) {
             MatmulParams q = p;
             if (bytes == 2) q.w_bf16 = w16.data() + c * n * k;
             if (bytes == 4) q.w = w32.data() + c * n * k;
             Matmul(q, MatmulMode::kDeterministic, pool);
           }
         },
         [&] {
           const auto* data = bytes == 2 ? w16.data() : reinterpret_cast<const uint16_t*>(w32.data());
           sink = sink + StreamRead(data, copies * n * k * bytes / 2, pool);
         }},
        /*budget_s=*/2.0, /*min_rounds=*/5);
    const double gb = static_cast<double>(copies * n * k * bytes) / 1e9;
    std::printf(
        "from memory: m %lld n %5lld k %5lld %s x %3lld: %6.1f GB/s, %.2fx a read of the same bytes (%.1f GB/s)\n",
        static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), bytes == 2 ? "bf16" : "fp32",
        static_cast<long long>(copies), gb / t[0], t[1] / t[0], gb / t[1]);
  }
}

// How many rows of the first 8 change bits when computed with m = 1 instead of m = 300.
void RowInvarianceCheck(ThreadPool* pool) {
  const int64_t m = 300, n = 1024, k = 1024;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(m * k), w(n * k), full(m * n), one(n);
  for (float& f : a) f = u(rng);
  for (float& f : w) f = 0.05f * u(rng);
  for (MatmulMode mode : {MatmulMode::kFast, MatmulMode::kDeterministic}) {
    MatmulParams p;
    p.a = a.data();
    p.w = w.data();
    p.out = full.data();
    p.m = m;
    p.n = n;
    p.k = k;
    Matmul(p, mode, pool);
    int differing = 0;
    for (int64_t i = 0; i < 8; ++i) {
      MatmulParams q = p;
      q.a = a.data() + i * k;
      q.out = one.data();
      q.m = 1;
      Matmul(q, mode, pool);
      differing += std::memcmp(one.data(), full.data() + i * n, n * sizeof(float)) != 0;
    }
    std::printf("%s: %d of 8 rows differ in bits between m=1 and m=300\n",
                mode == MatmulMode::kFast ? "openblas" : "deterministic", differing);
  }
}

}  // namespace
}  // namespace hybridserve

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  openblas_set_num_threads(threads);
  hybridserve::kernels::cpu::ThreadPool pool(threads);
  std::printf("threads %d (deterministic: ThreadPool; openblas: openblas_set_num_threads), kernel path %s\n", threads,
              hybridserve::kernels::cpu::KernelPathName(hybridserve::kernels::cpu::ActiveKernelPath()));
  for (int64_t m : {1, 8, 512}) {
    hybridserve::Run(m, 1024, 1024, &pool);
    hybridserve::Run(m, 4096, 1024, &pool);
    hybridserve::Run(m, 1024, 4096, &pool);
  }
  for (int64_t m : {1, 4}) {
    hybridserve::RunFromMemory(m, 1024, 1024, &pool);
    hybridserve::RunFromMemory(m, 4096, 1024, &pool);
  }
  hybridserve::RowInvarianceCheck(&pool);
  return 0;
}
