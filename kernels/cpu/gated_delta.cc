#include "kernels/cpu/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace hybridserve::kernels::cpu {
namespace {

constexpr float kL2NormEps = 1e-6f;  // transformers' l2norm (and FLA's)

// out = x / sqrt(|x|^2 + eps) when l2norm, else x; then times scale.
void PrepareVector(const float* x, int64_t n, bool l2norm, float scale, float* out) {
  float inv = 1.0f;
  if (l2norm) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    inv = 1.0f / std::sqrt(ss + kL2NormEps);
  }
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * scale;
}

float QueryScale(int64_t dk) { return 1.0f / std::sqrt(static_cast<float>(dk)); }

// One token of one value head on state s [dk, dv]; qn, kn prepared. The
// oracle and the decode update both run exactly this.
void Step(float* s, const float* qn, const float* kn, const float* v, float g, float beta, float* o, int64_t dk,
          int64_t dv, float* scratch /* [dv] */) {
  const float decay = std::exp(g);
  for (int64_t i = 0; i < dk * dv; ++i) s[i] *= decay;
  for (int64_t c = 0; c < dv; ++c) {
    float kv = 0.0f;
    for (int64_t a = 0; a < dk; ++a) kv += s[a * dv + c] * kn[a];
    scratch[c] = (v[c] - kv) * beta;
  }
  for (int64_t a = 0; a < dk; ++a) {
    for (int64_t c = 0; c < dv; ++c) s[a * dv + c] += kn[a] * scratch[c];
  }
  for (int64_t c = 0; c < dv; ++c) {
    float acc = 0.0f;
    for (int64_t a = 0; a < dk; ++a) acc += s[a * dv + c] * qn[a];
    o[c] = acc;
  }
}

// Copies the initial state (or zeros) into the working state.
std::vector<float> InitialState(const GatedDeltaParams& p) {
  const int64_t n = p.n_v_heads * p.dk * p.dv;
  if (p.initial_state == nullptr) return std::vector<float>(n, 0.0f);
  return std::vector<float>(p.initial_state, p.initial_state + n);
}

}  // namespace

KernelStatus GatedDeltaSequential(const GatedDeltaParams& p, const char** bad_field) {
  const KernelStatus st = CheckGatedDeltaParams(p, bad_field);
  if (st != kKernelOk) return st;
  const int64_t hk = p.n_k_heads, hv = p.n_v_heads, dk = p.dk, dv = p.dv;
  const int64_t ratio = hv / hk;
  const int64_t state_elems = hv * dk * dv;
  std::vector<float> s = InitialState(p);
  std::vector<float> qn(dk), kn(dk), scratch(dv);
  const float qscale = QueryScale(dk);
  int64_t row = 0;
  for (int64_t t = 0; t < p.seqlen; ++t) {
    for (int64_t h = 0; h < hv; ++h) {
      const int64_t kh = h / ratio;
      PrepareVector(p.q + (t * hk + kh) * dk, dk, p.l2norm_qk, qscale, qn.data());
      PrepareVector(p.k + (t * hk + kh) * dk, dk, p.l2norm_qk, 1.0f, kn.data());
      Step(s.data() + h * dk * dv, qn.data(), kn.data(), p.v + (t * hv + h) * dv, p.g[t * hv + h], p.beta[t * hv + h],
           p.o + (t * hv + h) * dv, dk, dv, scratch.data());
    }
    if ((p.start_pos + t + 1) % p.chunk_size == 0 && p.chunk_states != nullptr) {
      std::memcpy(p.chunk_states + row * state_elems, s.data(), sizeof(float) * state_elems);
      ++row;
    }
  }
  if (p.final_state != nullptr) std::memcpy(p.final_state, s.data(), sizeof(float) * state_elems);
  return kKernelOk;
}

KernelStatus GatedDeltaChunked(const GatedDeltaParams& p, const char** bad_field) {
  const KernelStatus st = CheckGatedDeltaParams(p, bad_field);
  if (st != kKernelOk) return st;
  const int64_t hk = p.n_k_heads, hv = p.n_v_heads, dk = p.dk, dv = p.dv;
  const int64_t ratio = hv / hk;
  const int64_t state_elems = hv * dk * dv;
  const int64_t cs = p.chunk_size;
  std::vector<float> s = InitialState(p);
  const float qscale = QueryScale(dk);
  std::vector<float> qc(cs * dk), kc(cs * dk), gc(cs), a(cs * cs), u(cs * dv), w(cs * dk), vnew(cs * dv);
  std::vector<float> kbeta(dk), qk(cs), snew(dk * dv);
  int64_t row = 0;
  int64_t t0 = 0;
  while (t0 < p.seqlen) {
    // The segment [t0, t1): up to the next absolute boundary or the end.
    const int64_t pos = p.start_pos + t0;
    const int64_t t1 = std::min(p.seqlen, t0 + (cs - pos % cs));
    const int64_t len = t1 - t0;
    for (int64_t h = 0; h < hv; ++h) {
      const int64_t kh = h / ratio;
      float* sh = s.data() + h * dk * dv;
      // Prepared q (scaled) and k, and the cumulative log decay within the chunk.
      float cum = 0.0f;
      for (int64_t i = 0; i < len; ++i) {
        const int64_t t = t0 + i;
        PrepareVector(p.q + (t * hk + kh) * dk, dk, p.l2norm_qk, qscale, qc.data() + i * dk);
        PrepareVector(p.k + (t * hk + kh) * dk, dk, p.l2norm_qk, 1.0f, kc.data() + i * dk);
        cum += p.g[t * hv + h];
        gc[i] = cum;
      }
      // UT system: A[i][j] = (beta_i k_i . k_j) exp(gc_i - gc_j), j < i; solve
      // (I + A) U = beta v and (I + A) W = beta k exp(gc) by forward substitution.
      for (int64_t i = 0; i < len; ++i) {
        const int64_t t = t0 + i;
        const float beta = p.beta[t * hv + h];
        for (int64_t x = 0; x < dk; ++x) kbeta[x] = kc[i * dk + x] * beta;
        for (int64_t j = 0; j < i; ++j) {
          float dot = 0.0f;
          for (int64_t x = 0; x < dk; ++x) dot += kbeta[x] * kc[j * dk + x];
          a[i * cs + j] = dot * std::exp(gc[i] - gc[j]);
        }
        const float* vt = p.v + (t * hv + h) * dv;
        const float egi = std::exp(gc[i]);
        for (int64_t c = 0; c < dv; ++c) u[i * dv + c] = vt[c] * beta;
        for (int64_t x = 0; x < dk; ++x) w[i * dk + x] = kbeta[x] * egi;
        for (int64_t j = 0; j < i; ++j) {
          const float aij = a[i * cs + j];
          for (int64_t c = 0; c < dv; ++c) u[i * dv + c] -= aij * u[j * dv + c];
          for (int64_t x = 0; x < dk; ++x) w[i * dk + x] -= aij * w[j * dk + x];
        }
        // The delta rule's correction against the state at the chunk start.
        for (int64_t c = 0; c < dv; ++c) {
          float ws = 0.0f;
          for (int64_t x = 0; x < dk; ++x) ws += w[i * dk + x] * sh[x * dv + c];
          vnew[i * dv + c] = u[i * dv + c] - ws;
        }
      }
      // Outputs: the decayed read of the chunk-start state plus the causal
      // within-chunk attention over the corrected values.
      for (int64_t i = 0; i < len; ++i) {
        const int64_t t = t0 + i;
        for (int64_t j = 0; j <= i; ++j) {
          float dot = 0.0f;
          for (int64_t x = 0; x < dk; ++x) dot += qc[i * dk + x] * kc[j * dk + x];
          qk[j] = dot * std::exp(gc[i] - gc[j]);
        }
        const float egi = std::exp(gc[i]);
        float* ot = p.o + (t * hv + h) * dv;
        for (int64_t c = 0; c < dv; ++c) {
          float inter = 0.0f;
          for (int64_t x = 0; x < dk; ++x) inter += qc[i * dk + x] * sh[x * dv + c];
          float acc = inter * egi;
          for (int64_t j = 0; j <= i; ++j) acc += qk[j] * vnew[j * dv + c];
          ot[c] = acc;
        }
      }
      // State recurrence: S = S exp(gc_last) + sum_j (k_j exp(gc_last - gc_j)) (outer) vnew_j.
      const float glast = gc[len - 1];
      const float elast = std::exp(glast);
      for (int64_t x = 0; x < dk * dv; ++x) snew[x] = sh[x] * elast;
      for (int64_t j = 0; j < len; ++j) {
        const float ej = std::exp(glast - gc[j]);
        for (int64_t x = 0; x < dk; ++x) {
          const float kx = kc[j * dk + x] * ej;
          for (int64_t c = 0; c < dv; ++c) snew[x * dv + c] += kx * vnew[j * dv + c];
        }
      }
      std::memcpy(sh, snew.data(), sizeof(float) * dk * dv);
    }
    if ((p.start_pos + t1) % cs == 0 && p.chunk_states != nullptr) {
      std::memcpy(p.chunk_states + row * state_elems, s.data(), sizeof(float) * state_elems);
      ++row;
    }
    t0 = t1;
  }
  if (p.final_state != nullptr) std::memcpy(p.final_state, s.data(), sizeof(float) * state_elems);
  return kKernelOk;
}

KernelStatus GatedDeltaDecode(const GatedDeltaDecodeParams& p, const char** bad_field) {
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
  std::vector<float> qn(dk), kn(dk), scratch(dv);
  const float qscale = QueryScale(dk);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t slot = p.state_slots != nullptr ? p.state_slots[b] : b;
    if (slot < 0) continue;
    float* sb = p.state + slot * hv * dk * dv;
    for (int64_t h = 0; h < hv; ++h) {
      const int64_t kh = h / ratio;
      PrepareVector(p.q + (b * hk + kh) * dk, dk, p.l2norm_qk, qscale, qn.data());
      PrepareVector(p.k + (b * hk + kh) * dk, dk, p.l2norm_qk, 1.0f, kn.data());
      Step(sb + h * dk * dv, qn.data(), kn.data(), p.v + (b * hv + h) * dv, p.g[b * hv + h], p.beta[b * hv + h],
           p.o + (b * hv + h) * dv, dk, dv, scratch.data());
    }
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
