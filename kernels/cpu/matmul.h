#ifndef HYBRIDSERVE_KERNELS_CPU_MATMUL_H_
#define HYBRIDSERVE_KERNELS_CPU_MATMUL_H_

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul_params.h"

namespace hybridserve::kernels::cpu {

// out = a @ w^T (+ bias) (+ out); see kernels/matmul_params.h. All return a KernelStatus.

// Deterministic mode, on the process's kernel path (cpu_features.h). On every
// path a row's bits depend only on that row of a, on w and on bias: never on
// m, on the other rows or on threads. The paths differ in the chain:
//
// avx2 (and any path for m == 0 work). Each out[i, j] is
//   two chains c = 0, 1, each an 8-lane fp32 vector; for each 8-element step s
//   (k in [8s, 8s + 8), the last step zero-padded when k % 8 != 0):
//   chain[s mod 2] = fma(a[i, 8s:8s+8], w[j, 8s:8s+8], chain[s mod 2]), i.e. lane l
//   of chain c sums k = 8s + l over the steps s = c mod 2, in ascending order;
//   r = hsum8(chain0 + chain1) (fixed tree, simd.h); r = r + bias[j] if bias;
//   r = out[i, j] + r if accumulate.
// A single row (decode) keeps an output's two chains in registers and reads
// each weight row once, front to back: one sequential stream per thread
// (eight rows side by side with one chain each, the chain before 2026-11-27,
// ran 0.75-0.9x as fast on AVX2). Register tiles (3x4, 2x6 rows x columns)
// run the chains one after the other; cache blocking over n and k (chains
// carried across k blocks, whose starts are multiples of 16) and the split
// of columns over threads keep the same chains, so a row's bits depend only
// on that row of a, on w and on bias: never on m, on the other rows or on
// threads. bf16 weights are widened exactly, so they give the bits of the
// fp32 path on the widened weights.
//
// avx512: one chain of 16 lanes (lane l sums k = l mod 16, zero-padded last
// step), reduced as r = Hsum(lanes[0:8] + lanes[8:16]); bf16 weights widened
// exactly (the bits of fp32 weights).
//
// avx512_bf16: fp32 weights as avx512. bf16 weights: each row of a is rounded
// to bf16 (nearest even), and lane l accumulates, per 32-element step of k,
// acc = (acc + a[2l+1] w[2l+1]) + a[2l] w[2l] (vdpbf16ps: exact products,
// two rounded adds, denormals flushed), then the same Hsum and bias. The
// rounding of a costs up to 2^-9 relative per product (as llama.cpp's bf16
// path); the weights were bf16 already.
int MatmulDeterministic(const MatmulParams& p, ThreadPool* pool);

// MatmulDeterministic on a given path; kKernelUnsupported when this CPU lacks
// it (tests compare the paths).
int MatmulDeterministicOnPath(const MatmulParams& p, KernelPath path, ThreadPool* pool);

// items[0, count) (Backend::MatmulBatch): those of fewer than 16 rows in one
// parallel region, larger ones one by one. Item i gets exactly the bits
// MatmulDeterministicOnPath(items[i], path) gives.
int MatmulDeterministicBatchOnPath(const MatmulParams* items, int64_t count, KernelPath path, ThreadPool* pool);

// Fast mode: OpenBLAS (cblas_sgemm, or cblas_sgemv when m == 1), using
// OpenBLAS's own threads (pool unused). bf16 weights are widened block by block
// into a scratch buffer first. Not row-invariant (docs/ARCHITECTURE.md section 3).
int MatmulFast(const MatmulParams& p, ThreadPool* pool);

// Dispatches on mode.
int Matmul(const MatmulParams& p, MatmulMode mode, ThreadPool* pool);
// Backend::MatmulBatch: deterministic mode in one parallel region on the
// process's kernel path; fast mode item by item (OpenBLAS's own threads).
int MatmulBatch(const MatmulParams* items, int64_t count, MatmulMode mode, ThreadPool* pool);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_MATMUL_H_
