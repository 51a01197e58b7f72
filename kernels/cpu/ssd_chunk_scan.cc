// Mamba2 SSD chunk scan on the CPU: blocks of block_size tokens on the absolute
// grid, each processed with fixed-order register-blocked GEMMs (small_gemm.h).

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/small_gemm.h"
#include "kernels/cpu/ssd_common.h"
#include "kernels/cpu/ssd_scan.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

// Default block: short blocks keep the quadratic intra-block work (~block/2
// multiply-adds per token and channel) small next to the two state products
// (d_state per token and channel), which dominate.
constexpr int64_t kDefaultBlock = 32;

int64_t RoundUp8(int64_t v) { return (v + 7) & ~int64_t{7}; }

// A slice of work: heads [h_begin, h_end) of group g. Slices of one group each
// compute the group's C.B products themselves (same code, same bits).
struct Slice {
  int64_t g = 0;
  int64_t h_begin = 0;
  int64_t h_end = 0;
};

std::vector<Slice> MakeSlices(int64_t n_groups, int64_t heads_per_group, int threads) {
  const int64_t pieces = n_groups >= threads ? 1 : std::min(heads_per_group, (threads + n_groups - 1) / n_groups);
  std::vector<Slice> slices;
  for (int64_t g = 0; g < n_groups; ++g) {
    for (int64_t i = 0; i < pieces; ++i) {
      slices.push_back({g, g * heads_per_group + i * heads_per_group / pieces,
                        g * heads_per_group + (i + 1) * heads_per_group / pieces});
    }
  }
  return slices;
}

// Scratch of one thread; sized once per call.
struct Workspace {
  std::vector<float> state_t;  // [heads of the slice, d_state, head_dim]: transposed states
  std::vector<float> bt;       // [d_state, ldt]: B of the block, transposed
  std::vector<float> cb;       // [block, ldt]: C_t . B_s
  std::vector<float> mix;      // [block, ldt]: causal decay-weighted C.B
  std::vector<float> yblk;     // [block, head_dim]
  std::vector<float> xs;       // [block, head_dim]: decay-weighted x for the state update
  std::vector<float> cum;      // [ldt]: prefix sums S_t
  std::vector<float> exp_cum;  // [ldt]: exp(S_t)
  std::vector<float> wdecay;   // [ldt]: exp(S_last - S_s) * dt_s
  std::vector<float> dtv;      // [ldt]
};

// Transposes one head's state [P, N] <-> [N, P].
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

class SliceScanner {
 public:
  SliceScanner(const SsdChunkScanParams& p, int64_t block, Workspace& ws)
      : p_(p), st_(ssd_internal::ResolveStrides(p)), block_(block), ldt_(RoundUp8(block)), ws_(ws) {}

  void Run(const Slice& s) {
    const int64_t P = p_.head_dim;
    const int64_t N = p_.d_state;
    const int64_t nh = s.h_end - s.h_begin;
    ws_.state_t.resize(nh * N * P);
    for (int64_t i = 0; i < nh; ++i) {
      float* dst = ws_.state_t.data() + i * N * P;
      if (p_.initial_state != nullptr) {
        Transpose(p_.initial_state + (s.h_begin + i) * P * N, P, N, dst);
      } else {
        std::fill(dst, dst + N * P, 0.0f);
      }
    }
    const int64_t first_chunk = p_.start_pos / p_.chunk_size;
    int64_t t = 0;
    while (t < p_.seqlen) {
      const int64_t abs = p_.start_pos + t;
      const int64_t len = std::min(p_.seqlen - t, (abs / block_ + 1) * block_ - abs);
      GroupProducts(s.g, t, len);
      for (int64_t h = s.h_begin; h < s.h_end; ++h) {
        HeadBlock(h, s.g, t, len, ws_.state_t.data() + (h - s.h_begin) * N * P);
      }
      t += len;
      const int64_t abs_end = p_.start_pos + t;
      if (p_.chunk_states != nullptr && abs_end % p_.chunk_size == 0) {
        const int64_t idx = abs_end / p_.chunk_size - first_chunk - 1;
        for (int64_t h = s.h_begin; h < s.h_end; ++h) {
          Transpose(ws_.state_t.data() + (h - s.h_begin) * N * P, N, P,
                    p_.chunk_states + (idx * p_.n_heads + h) * P * N);
        }
      }
    }
    if (p_.final_state != nullptr) {
      for (int64_t h = s.h_begin; h < s.h_end; ++h) {
        Transpose(ws_.state_t.data() + (h - s.h_begin) * N * P, N, P, p_.final_state + h * P * N);
      }
    }
  }

 private:
  // B^T and C.B^T of group g for tokens [t0, t0 + len).
  void GroupProducts(int64_t g, int64_t t0, int64_t len) {
    const int64_t N = p_.d_state;
    const float* B = p_.B + t0 * st_.bc + g * N;
    float* bt = ws_.bt.data();
    for (int64_t s = 0; s < len; ++s) {
      for (int64_t n = 0; n < N; ++n) bt[n * ldt_ + s] = B[s * st_.bc + n];
    }
    small_gemm::Args cb;
    cb.m = len;
    cb.n = len;
    cb.k = N;
    cb.a = p_.C + t0 * st_.bc + g * N;
    cb.lda = st_.bc;
    cb.b = bt;
    cb.ldb = ldt_;
    cb.c = ws_.cb.data();
    cb.ldc = ldt_;
    small_gemm::Gemm(cb);
  }

  void HeadBlock(int64_t h, int64_t g, int64_t t0, int64_t len, float* state_t) {
    const int64_t P = p_.head_dim;
    const int64_t N = p_.d_state;
    const float A = p_.A[h];
    float* cum = ws_.cum.data();
    float* dtv = ws_.dtv.data();
    // Prefix sums of dt * A over the block (padding lanes repeat the last sum).
    float run = 0.0f;
    for (int64_t s = 0; s < ldt_; ++s) {
      if (s < len) {
        dtv[s] = p_.dt[(t0 + s) * st_.dt + h];
        run = run + dtv[s] * A;
      } else {
        dtv[s] = 0.0f;
      }
      cum[s] = run;
    }
    const float last = cum[len - 1];
    for (int64_t s = 0; s < ldt_; s += 8) {
      const __m256 c = _mm256_loadu_ps(cum + s);
      _mm256_storeu_ps(ws_.exp_cum.data() + s, simd::Exp(c));
      const __m256 d = simd::Exp(_mm256_sub_ps(_mm256_set1_ps(last), c));
      _mm256_storeu_ps(ws_.wdecay.data() + s, _mm256_mul_ps(d, _mm256_loadu_ps(dtv + s)));
    }
    // mix[t, s] = (C_t.B_s * exp(S_t - S_s)) * dt_s for s <= t, else 0.
    for (int64_t t = 0; t < len; ++t) {
      const __m256 ct = _mm256_set1_ps(cum[t]);
      float* row = ws_.mix.data() + t * ldt_;
      const float* cbrow = ws_.cb.data() + t * ldt_;
      for (int64_t s = 0; s < ldt_; s += 8) {
        if (s > t) {
          _mm256_storeu_ps(row + s, _mm256_setzero_ps());
          continue;
        }
        const __m256 decay = simd::Exp(_mm256_sub_ps(ct, _mm256_loadu_ps(cum + s)));
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(cbrow + s), decay), _mm256_loadu_ps(dtv + s));
        // Zero the lanes s + i > t.
        const __m256i lanes =
            _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(s)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(t) + 1), lanes);
        v = _mm256_and_ps(v, _mm256_castsi256_ps(keep));
        _mm256_storeu_ps(row + s, v);
      }
    }
    const float* x = p_.x + t0 * st_.x + h * P;
    const float* C = p_.C + t0 * st_.bc + g * N;
    float* yblk = ws_.yblk.data();

    // yblk = C_blk . state_in  ([len, N] x [N, P]).
    small_gemm::Args ys;
    ys.m = len;
    ys.n = P;
    ys.k = N;
    ys.a = C;
    ys.lda = st_.bc;
    ys.b = state_t;
    ys.ldb = P;
    ys.c = yblk;
    ys.ldc = P;
    small_gemm::Gemm(ys);

    // yblk = exp(S_t) * yblk + mix . x_blk  ([len, len] x [len, P], causal).
    small_gemm::Args yi;
    yi.m = len;
    yi.n = P;
    yi.k = len;
    yi.a = ws_.mix.data();
    yi.lda = ldt_;
    yi.b = x;
    yi.ldb = st_.x;
    yi.c = yblk;
    yi.ldc = P;
    yi.load_c = true;
    yi.row_scale = ws_.exp_cum.data();
    yi.causal = true;
    small_gemm::Gemm(yi);

    // y = fma(D, x, yblk).
    for (int64_t t = 0; t < len; ++t) {
      float* y = p_.y + (t0 + t) * st_.y + h * P;
      const float* yb = yblk + t * P;
      if (p_.D != nullptr) {
        const float* xt = x + t * st_.x;
        const __m256 dv = _mm256_set1_ps(p_.D[h]);
        int64_t i = 0;
        for (; i + 8 <= P; i += 8) {
          _mm256_storeu_ps(y + i, _mm256_fmadd_ps(dv, _mm256_loadu_ps(xt + i), _mm256_loadu_ps(yb + i)));
        }
        for (; i < P; ++i) y[i] = std::fma(p_.D[h], xt[i], yb[i]);
      } else {
        std::memcpy(y, yb, P * sizeof(float));
      }
    }

    // state_t = exp(S_last) * state_t + B_blk^T . (wdecay_s * x_s)  ([N, len] x [len, P]).
    float* xs = ws_.xs.data();
    for (int64_t s = 0; s < len; ++s) {
      const float w = ws_.wdecay[s];
      const float* xt = x + s * st_.x;
      for (int64_t i = 0; i < P; ++i) xs[s * P + i] = w * xt[i];
    }
    small_gemm::Args su;
    su.m = N;
    su.n = P;
    su.k = len;
    su.a = ws_.bt.data();
    su.lda = ldt_;
    su.b = xs;
    su.ldb = P;
    su.c = state_t;
    su.ldc = P;
    su.load_c = true;
    su.scale = ws_.exp_cum[len - 1];
    small_gemm::Gemm(su);
  }

  const SsdChunkScanParams& p_;
  const ssd_internal::ScanStrides st_;
  const int64_t block_;
  const int64_t ldt_;
  Workspace& ws_;
};

}  // namespace

int64_t SsdResolvedBlockSize(const SsdChunkScanParams& p) {
  if (p.chunk_size <= 0 || p.block_size < 0) return 0;
  if (p.block_size == 0) return std::gcd(p.chunk_size, kDefaultBlock);
  return p.chunk_size % p.block_size == 0 ? p.block_size : 0;
}

int SsdChunkScan(const SsdChunkScanParams& p, ThreadPool* pool) {
  if (const int status = CheckSsdChunkScanParams(p); status != kKernelOk) return status;
  const int64_t block = SsdResolvedBlockSize(p);
  if (block <= 0) return kKernelInvalidArgument;
  if (p.seqlen == 0) {
    // The state passes through unchanged.
    if (p.final_state != nullptr && p.final_state != p.initial_state) {
      const int64_t n = p.n_heads * p.head_dim * p.d_state;
      if (p.initial_state != nullptr) {
        std::memcpy(p.final_state, p.initial_state, n * sizeof(float));
      } else {
        std::fill(p.final_state, p.final_state + n, 0.0f);
      }
    }
    return kKernelOk;
  }
  const int threads = pool ? pool->num_threads() : 1;
  const std::vector<Slice> slices = MakeSlices(p.n_groups, p.n_heads / p.n_groups, threads);
  const int64_t ldt = RoundUp8(block);
  ParallelFor(pool, static_cast<int64_t>(slices.size()), [&](int64_t begin, int64_t end) {
    Workspace ws;
    ws.bt.resize(p.d_state * ldt);
    ws.cb.resize(block * ldt);
    ws.mix.resize(block * ldt);
    ws.yblk.resize(block * p.head_dim);
    ws.xs.resize(block * p.head_dim);
    ws.cum.resize(ldt);
    ws.exp_cum.resize(ldt);
    ws.wdecay.resize(ldt);
    ws.dtv.resize(ldt);
    SliceScanner scanner(p, block, ws);
    for (int64_t i = begin; i < end; ++i) scanner.Run(slices[i]);
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
