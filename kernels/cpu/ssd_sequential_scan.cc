// Token-by-token Mamba2 recurrence: the oracle of the chunk scan, the baseline
// of its benchmark, and (one token at a time) the decode step.

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/ssd_common.h"
#include "kernels/cpu/ssd_scan.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

// Advances one head's state [head_dim, d_state] by one token and writes its
// output row y[head_dim]. The one arithmetic of a recurrence step:
//   dA = expf(dt * A);  u_p = dt * x_p
//   s[p, n] = fma(u_p, B[n], s[p, n] * dA)
//   y_p = sum_n s[p, n] * C[n]: 8-lane vector v (n in [8v, 8v + 8), the last one
//         zero-padded) accumulates by fma into acc[v % 4] in ascending v; then
//         hsum8((acc0 + acc1) + (acc2 + acc3))
//   y_p = fma(D, x_p, y_p) if D;  y_p = y_p * silu(z_p) if z
// Four accumulators keep the fma chains short enough to overlap.
inline void StepHead(float* state, const float* x, float dt, float A, const float* B, const float* C, const float* D,
                     const float* z, int64_t head_dim, int64_t d_state, float* y) {
  const float dA = std::exp(dt * A);
  const __m256 vdA = _mm256_set1_ps(dA);
  const int64_t n_full = d_state & ~int64_t{7};
  const int64_t tail = d_state - n_full;
  for (int64_t p = 0; p < head_dim; ++p) {
    const __m256 vu = _mm256_set1_ps(dt * x[p]);
    float* h = state + p * d_state;
    // Named accumulators (an indexed array would live on the stack).
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    auto step = [&](int64_t n, __m256& acc) {
      const __m256 hv = _mm256_fmadd_ps(vu, _mm256_loadu_ps(B + n), _mm256_mul_ps(_mm256_loadu_ps(h + n), vdA));
      _mm256_storeu_ps(h + n, hv);
      acc = _mm256_fmadd_ps(hv, _mm256_loadu_ps(C + n), acc);
    };
    auto acc_of = [&](int64_t v) -> __m256& {
      switch (v & 3) {
        case 0:
          return acc0;
        case 1:
          return acc1;
        case 2:
          return acc2;
        default:
          return acc3;
      }
    };
    int64_t n = 0;
    for (; n + 32 <= n_full; n += 32) {
      step(n, acc0);
      step(n + 8, acc1);
      step(n + 16, acc2);
      step(n + 24, acc3);
    }
    for (; n < n_full; n += 8) step(n, acc_of(n / 8));
    if (tail) {
      __m256& acc = acc_of(n_full / 8);
      const __m256 hv = _mm256_fmadd_ps(vu, simd::LoadPartial(B + n_full, tail),
                                        _mm256_mul_ps(simd::LoadPartial(h + n_full, tail), vdA));
      simd::StorePartial(h + n_full, hv, tail);
      acc = _mm256_fmadd_ps(hv, simd::LoadPartial(C + n_full, tail), acc);
    }
    float out = simd::Hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    if (D != nullptr) out = std::fma(*D, x[p], out);
    if (z != nullptr) out = out * Silu(z[p]);
    y[p] = out;
  }
}

// Rows of one token are a token stride apart (often a multiple of 4 KiB), which
// the hardware prefetchers do not follow across pages: fetch them ahead.
constexpr int64_t kPrefetchTokens = 4;

inline void Prefetch(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

}  // namespace

int SsdSequentialScan(const SsdChunkScanParams& p, ThreadPool* pool) {
  if (const int status = CheckSsdChunkScanParams(p); status != kKernelOk) return status;
  const ssd_internal::ScanStrides st = ssd_internal::ResolveStrides(p);
  const int64_t P = p.head_dim;
  const int64_t N = p.d_state;
  const int64_t state_elems = P * N;
  const int64_t heads_per_group = p.n_heads / p.n_groups;
  const int64_t first_chunk = p.start_pos / p.chunk_size;

  ParallelFor(pool, p.n_heads, [&](int64_t h_begin, int64_t h_end) {
    std::vector<float> state(state_elems);
    for (int64_t h = h_begin; h < h_end; ++h) {
      if (p.initial_state != nullptr) {
        std::memcpy(state.data(), p.initial_state + h * state_elems, state_elems * sizeof(float));
      } else {
        std::fill(state.begin(), state.end(), 0.0f);
      }
      const int64_t g = h / heads_per_group;
      const float A = p.A[h];
      const float* D = p.D ? p.D + h : nullptr;
      for (int64_t t = 0; t < p.seqlen; ++t) {
        if (t + kPrefetchTokens < p.seqlen) {
          const int64_t tp = t + kPrefetchTokens;
          Prefetch(p.x + tp * st.x + h * P, P);
          Prefetch(p.B + tp * st.bc + g * N, N);
          Prefetch(p.C + tp * st.bc + g * N, N);
        }
        StepHead(state.data(), p.x + t * st.x + h * P, p.dt[t * st.dt + h], A, p.B + t * st.bc + g * N,
                 p.C + t * st.bc + g * N, D, nullptr, P, N, p.y + t * st.y + h * P);
        const int64_t pos = p.start_pos + t + 1;
        if (p.chunk_states != nullptr && pos % p.chunk_size == 0) {
          const int64_t idx = pos / p.chunk_size - first_chunk - 1;
          std::memcpy(p.chunk_states + (idx * p.n_heads + h) * state_elems, state.data(), state_elems * sizeof(float));
        }
      }
      if (p.final_state != nullptr) {
        std::memcpy(p.final_state + h * state_elems, state.data(), state_elems * sizeof(float));
      }
    }
  });
  return kKernelOk;
}

int SelectiveStateUpdate(const SelectiveStateUpdateParams& p, ThreadPool* pool) {
  if (const int status = CheckSelectiveStateUpdateParams(p); status != kKernelOk) return status;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t slot = p.state_slots ? p.state_slots[b] : b;
    if (slot >= p.num_slots) return kKernelInvalidArgument;
  }
  const int64_t P = p.head_dim;
  const int64_t N = p.d_state;
  const int64_t xs = p.x_batch_stride ? p.x_batch_stride : p.n_heads * P;
  const int64_t dts = p.dt_batch_stride ? p.dt_batch_stride : p.n_heads;
  const int64_t bcs = p.bc_batch_stride ? p.bc_batch_stride : p.n_groups * N;
  const int64_t zs = p.z_batch_stride ? p.z_batch_stride : p.n_heads * P;
  const int64_t ys = p.y_batch_stride ? p.y_batch_stride : p.n_heads * P;
  const int64_t heads_per_group = p.n_heads / p.n_groups;

  // One task per (sequence, head): outputs and states are disjoint.
  ParallelFor(pool, p.batch * p.n_heads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / p.n_heads;
      const int64_t h = i % p.n_heads;
      const int64_t slot = p.state_slots ? p.state_slots[b] : b;
      if (slot < 0) continue;
      const int64_t g = h / heads_per_group;
      StepHead(p.state + (slot * p.n_heads + h) * P * N, p.x + b * xs + h * P, p.dt[b * dts + h], p.A[h],
               p.B + b * bcs + g * N, p.C + b * bcs + g * N, p.D ? p.D + h : nullptr,
               p.z ? p.z + b * zs + h * P : nullptr, P, N, p.y + b * ys + h * P);
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
