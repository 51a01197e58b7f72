#include "kernels/cpu/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/small_gemm.h"

namespace hybridserve::kernels::cpu {
namespace {

constexpr float kL2NormEps = 1e-6f;  // transformers' l2norm (and FLA's)

// out = x / sqrt(|x|^2 + eps) when l2norm, else x; then times scale.
void PrepareVector(const float* x, int64_t n, bool l2norm, float scale, float* out) {
  float inv = 1.0f;
  if (l2norm) inv = 1.0f / std::sqrt(simd::SumOfSquares(x, n) + kL2NormEps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * scale;
}

float QueryScale(int64_t dk) { return 1.0f / std::sqrt(static_cast<float>(dk)); }

// One token of one value head on state s [dk, dv]; qn, kn prepared. The
// oracle and the decode update both run exactly this. Every sum runs over the
// key index a in ascending order; the loops over the value index c are
// independent (vectorisable) and do not change any bit.
void Step(float* s, const float* qn, const float* kn, const float* v, float g, float beta, float* o, int64_t dk,
          int64_t dv, float* scratch /* [dv] */) {
  const float decay = std::exp(g);
  for (int64_t i = 0; i < dk * dv; ++i) s[i] *= decay;
  for (int64_t c = 0; c < dv; ++c) scratch[c] = 0.0f;
  for (int64_t a = 0; a < dk; ++a) {
    const float* sa = s + a * dv;
    const float ka = kn[a];
    for (int64_t c = 0; c < dv; ++c) scratch[c] += sa[c] * ka;
  }
  for (int64_t c = 0; c < dv; ++c) scratch[c] = (v[c] - scratch[c]) * beta;
  for (int64_t c = 0; c < dv; ++c) o[c] = 0.0f;
  for (int64_t a = 0; a < dk; ++a) {
    float* sa = s + a * dv;
    const float ka = kn[a];
    const float qa = qn[a];
    for (int64_t c = 0; c < dv; ++c) sa[c] += ka * scratch[c];
    for (int64_t c = 0; c < dv; ++c) o[c] += sa[c] * qa;
  }
}

// Resolved element strides of one call's q, k, v rows.
struct Strides {
  int64_t q, k, v;
};

Strides PrefillStrides(const GatedDeltaParams& p) {
  return {p.q_token_stride ? p.q_token_stride : p.n_k_heads * p.dk,
          p.k_token_stride ? p.k_token_stride : p.n_k_heads * p.dk,
          p.v_token_stride ? p.v_token_stride : p.n_v_heads * p.dv};
}

// The state of value head h at the call's start (zeros without initial_state).
void LoadHeadState(const GatedDeltaParams& p, int64_t h, float* s) {
  const int64_t n = p.dk * p.dv;
  if (p.initial_state == nullptr) {
    std::fill(s, s + n, 0.0f);
  } else {
    std::memcpy(s, p.initial_state + h * n, sizeof(float) * n);
  }
}

// Writes head h's state to chunk_states row `row` when position `end` (absolute,
// exclusive) is a chunk boundary.
void MaybeStoreChunkState(const GatedDeltaParams& p, int64_t end, int64_t row, int64_t h, const float* s) {
  if (p.chunk_states == nullptr || end % p.chunk_size != 0) return;
  const int64_t n = p.dk * p.dv;
  std::memcpy(p.chunk_states + (row * p.n_v_heads + h) * n, s, sizeof(float) * n);
}

// Per-task working memory of the chunked prefill, sized once per task (never
// per token or per chunk).
struct ChunkScratch {
  ChunkScratch(int64_t cs, int64_t dk, int64_t dv)
      : ld(cs),
        qc(cs * dk),
        kc(cs * dk),
        kt(dk * cs),
        kdt(dk * cs),
        gc(cs + 8, 0.0f),
        egc(cs),
        dl(cs),
        dec(cs + 8),
        amat(cs * cs),
        qk(cs * cs),
        ks(cs * dv),
        vn(cs * dv),
        acc(dv),
        s(dk * dv) {}
  int64_t ld;  // the block length: row stride of the [., block] buffers
  std::vector<float> qc, kc, kt, kdt, gc, egc, dl, dec, amat, qk, ks, vn, acc, s;
};

// dec[j] = exp(gc_i - gc[j]) for j in [0, n), with the fixed-function vector
// exp of simd.h (about 1 ulp; the same bits wherever it runs). gc holds at
// least n rounded up to 8 finite entries.
void DecayRow(float gci, const float* gc, int64_t n, float* dec) {
  const __m256 gi = _mm256_set1_ps(gci);
  for (int64_t j = 0; j < n; j += 8) {
    simd::StorePartial(dec + j, simd::Exp(_mm256_sub_ps(gi, _mm256_loadu_ps(gc + j))), n - j);
  }
}

small_gemm::Args GemmArgs(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                          float* c, int64_t ldc) {
  small_gemm::Args g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.c = c;
  g.ldc = ldc;
  return g;
}

// One segment [t0, t0 + len) of the absolute block grid (at most one block) for
// value head h on its state s [dk, dv], updated in place: the chunked rule
// (transformers' torch_chunk_gated_delta_rule) with W S folded into the
// right-hand side of the UT solve. With q, k prepared, gc_i the cumulative log
// decay from the segment start, e_i = exp(gc_i), d_ij = exp(gc_i - gc_j):
//   A[i][j]  = (beta_i k_i . k_j) d_ij   (j < i)     QK[i][j] = (q_i . k_j) d_ij   (j <= i)
//   R_i      = beta_i (v_i - e_i (k_i S))
//   Vn_i     = R_i - sum_{j<i} A[i][j] Vn_j         (forward substitution: (I + A) Vn = R)
//   o_i      = e_i (q_i S) + sum_{j<=i} QK[i][j] Vn_j
//   S        = e_last S + sum_j (k_j exp(gc_last - gc_j)) (outer) Vn_j
// The products run on small_gemm (fixed fused multiply-add chains, register
// tiles); every bit depends only on the segment's tokens and s at its start.
void ChunkSegment(const GatedDeltaParams& p, const Strides& st, int64_t h, int64_t t0, int64_t len, ChunkScratch& m) {
  const int64_t dk = p.dk, dv = p.dv, cs = m.ld, hv = p.n_v_heads;
  const int64_t kh = h / (hv / p.n_k_heads);
  const float qscale = QueryScale(dk);
  float* s = m.s.data();
  float *qc = m.qc.data(), *kc = m.kc.data(), *kt = m.kt.data(), *kdt = m.kdt.data(), *gc = m.gc.data();
  float *egc = m.egc.data(), *dl = m.dl.data(), *dec = m.dec.data(), *amat = m.amat.data(), *qk = m.qk.data();
  float *ks = m.ks.data(), *vn = m.vn.data(), *acc = m.acc.data();
  float* o0 = p.o + (t0 * hv + h) * dv;  // row i at o0 + i * hv * dv
  const int64_t ldo = hv * dv;
  // Prepared q (scaled) and k, k transposed [dk, cs], the cumulative log decay.
  float cum = 0.0f;
  for (int64_t i = 0; i < len; ++i) {
    const int64_t t = t0 + i;
    PrepareVector(p.q + t * st.q + kh * dk, dk, p.l2norm_qk, qscale, qc + i * dk);
    PrepareVector(p.k + t * st.k + kh * dk, dk, p.l2norm_qk, 1.0f, kc + i * dk);
    for (int64_t x = 0; x < dk; ++x) kt[x * cs + i] = kc[i * dk + x];
    cum += p.g[t * hv + h];
    gc[i] = cum;
  }
  for (int64_t i = len; i < cs + 8; ++i) gc[i] = cum;  // finite lanes past the segment for DecayRow
  for (int64_t i = 0; i < len; ++i) egc[i] = std::exp(gc[i]);
  DecayRow(cum, gc, len, dl);  // exp(gc_last - gc_j)
  // k_i . k_j and q_i . k_j for every pair, then the decays and the masks.
  small_gemm::Gemm(GemmArgs(len, len, dk, kc, dk, kt, cs, amat, cs));
  small_gemm::Gemm(GemmArgs(len, len, dk, qc, dk, kt, cs, qk, cs));
  for (int64_t i = 0; i < len; ++i) {
    const float beta = p.beta[(t0 + i) * hv + h];
    DecayRow(gc[i], gc, i + 1, dec);
    float* ai = amat + i * cs;
    float* qi = qk + i * cs;
    for (int64_t j = 0; j < i; ++j) ai[j] = (beta * ai[j]) * dec[j];
    for (int64_t j = 0; j <= i; ++j) qi[j] = qi[j] * dec[j];
    for (int64_t j = i + 1; j < len; ++j) qi[j] = 0.0f;  // the causal GEMM below may read them
  }
  // k_i S and q_i S (the latter straight into the output rows).
  small_gemm::Gemm(GemmArgs(len, dv, dk, kc, dk, s, dv, ks, dv));
  small_gemm::Gemm(GemmArgs(len, dv, dk, qc, dk, s, dv, o0, ldo));
  // Right-hand side, then forward substitution row by row.
  for (int64_t i = 0; i < len; ++i) {
    const float beta = p.beta[(t0 + i) * hv + h];
    const float e = egc[i];
    const float* vt = p.v + (t0 + i) * st.v + h * dv;
    const float* ksi = ks + i * dv;
    float* vi = vn + i * dv;
    for (int64_t c = 0; c < dv; ++c) vi[c] = beta * (vt[c] - e * ksi[c]);
    if (i == 0) continue;
    small_gemm::Gemm(GemmArgs(1, dv, i, amat + i * cs, cs, vn, dv, acc, dv));
    for (int64_t c = 0; c < dv; ++c) vi[c] -= acc[c];
  }
  // o_i = e_i (q_i S) + sum_j QK[i][j] Vn_j.
  small_gemm::Args out = GemmArgs(len, dv, len, qk, cs, vn, dv, o0, ldo);
  out.load_c = true;
  out.row_scale = egc;
  out.causal = true;
  small_gemm::Gemm(out);
  // S = e_last S + (k exp(gc_last - gc))^T Vn.
  for (int64_t x = 0; x < dk; ++x) {
    const float* ktx = kt + x * cs;
    float* kdx = kdt + x * cs;
    for (int64_t j = 0; j < len; ++j) kdx[j] = ktx[j] * dl[j];
  }
  small_gemm::Args upd = GemmArgs(dk, dv, len, kdt, cs, vn, dv, s, dv);
  upd.load_c = true;
  upd.scale = egc[len - 1];
  small_gemm::Gemm(upd);
}

}  // namespace

KernelStatus GatedDeltaSequential(const GatedDeltaParams& p, const char** bad_field) {
  const KernelStatus st = CheckGatedDeltaParams(p, bad_field);
  if (st != kKernelOk) return st;
  const int64_t hv = p.n_v_heads, dk = p.dk, dv = p.dv;
  const int64_t ratio = hv / p.n_k_heads;
  const Strides str = PrefillStrides(p);
  std::vector<float> s(dk * dv), qn(dk), kn(dk), scratch(dv);
  const float qscale = QueryScale(dk);
  for (int64_t h = 0; h < hv; ++h) {
    const int64_t kh = h / ratio;
    LoadHeadState(p, h, s.data());
    int64_t row = 0;
    for (int64_t t = 0; t < p.seqlen; ++t) {
      PrepareVector(p.q + t * str.q + kh * dk, dk, p.l2norm_qk, qscale, qn.data());
      PrepareVector(p.k + t * str.k + kh * dk, dk, p.l2norm_qk, 1.0f, kn.data());
      Step(s.data(), qn.data(), kn.data(), p.v + t * str.v + h * dv, p.g[t * hv + h], p.beta[t * hv + h],
           p.o + (t * hv + h) * dv, dk, dv, scratch.data());
      const int64_t end = p.start_pos + t + 1;
      if (end % p.chunk_size == 0) MaybeStoreChunkState(p, end, row++, h, s.data());
    }
    if (p.final_state != nullptr) std::memcpy(p.final_state + h * dk * dv, s.data(), sizeof(float) * dk * dv);
  }
  return kKernelOk;
}

KernelStatus GatedDeltaChunked(const GatedDeltaParams& p, const char** bad_field, ThreadPool* pool) {
  const KernelStatus st = CheckGatedDeltaParams(p, bad_field);
  if (st != kKernelOk) return st;
  const Strides str = PrefillStrides(p);
  const int64_t n = p.dk * p.dv;
  // Value heads are independent: each task runs whole heads through every
  // chunk, so no bit depends on the thread count. initial_state and
  // final_state may alias: a head's state is read before it is written, and
  // heads do not share rows.
  ParallelFor(pool, p.n_v_heads, [&](int64_t h_begin, int64_t h_end) {
    const int64_t block = GatedDeltaBlockSize(p.chunk_size);
    ChunkScratch m(block, p.dk, p.dv);
    for (int64_t h = h_begin; h < h_end; ++h) {
      LoadHeadState(p, h, m.s.data());
      int64_t row = 0;
      int64_t t0 = 0;
      while (t0 < p.seqlen) {
        // The segment [t0, t1): up to the next absolute block boundary or the end.
        const int64_t pos = p.start_pos + t0;
        const int64_t t1 = std::min(p.seqlen, t0 + (block - pos % block));
        ChunkSegment(p, str, h, t0, t1 - t0, m);
        const int64_t end = p.start_pos + t1;
        if (end % p.chunk_size == 0) MaybeStoreChunkState(p, end, row++, h, m.s.data());
        t0 = t1;
      }
      if (p.final_state != nullptr) std::memcpy(p.final_state + h * n, m.s.data(), sizeof(float) * n);
    }
  });
  return kKernelOk;
}

KernelStatus GatedDeltaDecode(const GatedDeltaDecodeParams& p, const char** bad_field, ThreadPool* pool) {
  const KernelStatus st = CheckGatedDeltaDecodeParams(p, bad_field);
  if (st != kKernelOk) return st;
  for (int64_t b = 0; b < p.batch && p.state_slots != nullptr; ++b) {
    if (p.state_slots[b] >= p.num_slots) {
      if (bad_field != nullptr) *bad_field = "state_slots";
      return kKernelInvalidArgument;
    }
  }
  if (p.state_slots == nullptr && p.batch > p.num_slots) {
    if (bad_field != nullptr) *bad_field = "num_slots";
    return kKernelInvalidArgument;
  }
  const int64_t hk = p.n_k_heads, hv = p.n_v_heads, dk = p.dk, dv = p.dv;
  const int64_t ratio = hv / hk;
  const int64_t qs = p.q_batch_stride ? p.q_batch_stride : hk * dk;
  const int64_t ks = p.k_batch_stride ? p.k_batch_stride : hk * dk;
  const int64_t vs = p.v_batch_stride ? p.v_batch_stride : hv * dv;
  const float qscale = QueryScale(dk);
  // (row, value head) pairs are independent; each writes its own state rows.
  ParallelFor(pool, p.batch * hv, [&](int64_t begin, int64_t end) {
    std::vector<float> qn(dk), kn(dk), scratch(dv);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / hv, h = i % hv;
      const int64_t slot = p.state_slots != nullptr ? p.state_slots[b] : b;
      if (slot < 0) continue;
      const int64_t kh = h / ratio;
      PrepareVector(p.q + b * qs + kh * dk, dk, p.l2norm_qk, qscale, qn.data());
      PrepareVector(p.k + b * ks + kh * dk, dk, p.l2norm_qk, 1.0f, kn.data());
      Step(p.state + (slot * hv + h) * dk * dv, qn.data(), kn.data(), p.v + b * vs + h * dv, p.g[b * hv + h],
           p.beta[b * hv + h], p.o + (b * hv + h) * dv, dk, dv, scratch.data());
    }
  });
  return kKernelOk;
}

KernelStatus GatedDeltaGates(const GatedDeltaGatesParams& p, const char** bad_field, ThreadPool* pool) {
  const KernelStatus st = CheckGatedDeltaGatesParams(p, bad_field);
  if (st != kKernelOk) return st;
  const int64_t as = p.a_row_stride ? p.a_row_stride : p.n_heads;
  const int64_t bs = p.b_row_stride ? p.b_row_stride : p.n_heads;
  ParallelForRows(pool, p.n_tokens, p.n_heads, [&](int64_t t) {
    const float* a = p.a + t * as;
    const float* b = p.b + t * bs;
    float* g = p.g + t * p.n_heads;
    float* beta = p.beta + t * p.n_heads;
    for (int64_t h = 0; h < p.n_heads; ++h) {
      beta[h] = Sigmoid(b[h]);
      g[h] = -std::exp(p.a_log[h]) * Softplus(a[h] + p.dt_bias[h]);
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
