#include "kernels/cpu/gated_deltanet_layer.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/conv1d_params.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/conv1d.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/norm.h"
#include "kernels/gated_delta_params.h"
#include "kernels/norm_params.h"

namespace hybridserve::kernels::cpu {
namespace {

// y[o] = sum_i w[o, i] * x[i], summed in ascending i (fp32).
void MatVec(const float* w, const float* x, int64_t rows, int64_t cols, float* y) {
  for (int64_t o = 0; o < rows; ++o) {
    const float* wr = w + o * cols;
    float acc = 0.0f;
    for (int64_t i = 0; i < cols; ++i) acc += wr[i] * x[i];
    y[o] = acc;
  }
}

KernelStatus Fail(const char* field, const char** bad_field) {
  if (bad_field != nullptr) *bad_field = field;
  return kKernelInvalidArgument;
}

float Beta(float b) { return 1.0f / (1.0f + std::exp(-b)); }

float LogDecay(const GatedDeltaNetLayerWeights& w, int64_t h, float a) {
  return -std::exp(w.a_log[h]) * Softplus(a + w.dt_bias[h]);
}

// Qwen3.5's projections: already in the conv's channel order.
void ProjectSplit(const GatedDeltaNetLayerShape& s, const GatedDeltaNetLayerWeights& w, const float* x, int64_t n,
                  float* conv_in, float* z, float* beta, float* g) {
  const int64_t channels = GatedDeltaNetConvChannels(s);
  const int64_t value_dim = s.n_v_heads * s.dv;
  std::vector<float> b(s.n_v_heads), a(s.n_v_heads);
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * s.hidden;
    MatVec(w.in_proj_qkv, xt, channels, s.hidden, conv_in + t * channels);
    MatVec(w.in_proj_z, xt, value_dim, s.hidden, z + t * value_dim);
    MatVec(w.in_proj_b, xt, s.n_v_heads, s.hidden, b.data());
    MatVec(w.in_proj_a, xt, s.n_v_heads, s.hidden, a.data());
    for (int64_t h = 0; h < s.n_v_heads; ++h) {
      beta[t * s.n_v_heads + h] = Beta(b[h]);
      g[t * s.n_v_heads + h] = LogDecay(w, h, a[h]);
    }
  }
}

// The input projections of n tokens, un-interleaved per key head group
// (transformers' fix_query_key_value_ordering) for Qwen3-Next's form:
// conv_in [n, channels] in the conv's [q | k | v] order, z [n, n_v*dv], beta
// and g [n, n_v].
void Project(const GatedDeltaNetLayerShape& s, const GatedDeltaNetLayerWeights& w, const float* x, int64_t n,
             float* conv_in, float* z, float* beta, float* g) {
  if (w.in_proj_qkvz == nullptr) {
    ProjectSplit(s, w, x, n, conv_in, z, beta, g);
    return;
  }
  const int64_t r = s.n_v_heads / s.n_k_heads;
  const int64_t group_cols = 2 * s.dk + 2 * r * s.dv;
  const int64_t channels = GatedDeltaNetConvChannels(s);
  const int64_t key_dim = s.n_k_heads * s.dk;
  const int64_t value_dim = s.n_v_heads * s.dv;
  std::vector<float> qkvz(s.n_k_heads * group_cols), ba(s.n_k_heads * 2 * r);
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * s.hidden;
    MatVec(w.in_proj_qkvz, xt, static_cast<int64_t>(qkvz.size()), s.hidden, qkvz.data());
    MatVec(w.in_proj_ba, xt, static_cast<int64_t>(ba.size()), s.hidden, ba.data());
    float* ct = conv_in + t * channels;
    float* zt = z + t * value_dim;
    for (int64_t grp = 0; grp < s.n_k_heads; ++grp) {
      const float* src = qkvz.data() + grp * group_cols;
      for (int64_t a = 0; a < s.dk; ++a) {
        ct[grp * s.dk + a] = src[a];
        ct[key_dim + grp * s.dk + a] = src[s.dk + a];
      }
      for (int64_t i = 0; i < r * s.dv; ++i) {
        ct[2 * key_dim + grp * r * s.dv + i] = src[2 * s.dk + i];
        zt[grp * r * s.dv + i] = src[2 * s.dk + r * s.dv + i];
      }
      for (int64_t j = 0; j < r; ++j) {
        const int64_t h = grp * r + j;
        const float b = ba[grp * 2 * r + j];
        const float a = ba[grp * 2 * r + r + j];
        beta[t * s.n_v_heads + h] = Beta(b);
        g[t * s.n_v_heads + h] = LogDecay(w, h, a);
      }
    }
  }
}

// Splits the conv output [n, channels] into packed q, k [n, n_k, dk] and v [n, n_v, dv].
void SplitQkv(const GatedDeltaNetLayerShape& s, const float* conv_out, int64_t n, float* q, float* k, float* v) {
  const int64_t channels = GatedDeltaNetConvChannels(s);
  const int64_t key_dim = s.n_k_heads * s.dk;
  const int64_t value_dim = s.n_v_heads * s.dv;
  for (int64_t t = 0; t < n; ++t) {
    const float* c = conv_out + t * channels;
    for (int64_t i = 0; i < key_dim; ++i) {
      q[t * key_dim + i] = c[i];
      k[t * key_dim + i] = c[key_dim + i];
    }
    for (int64_t i = 0; i < value_dim; ++i) v[t * value_dim + i] = c[2 * key_dim + i];
  }
}

// The gated norm per value head (norm before gate: rmsnorm(o) * w * silu(z)),
// in place on o [n, n_v*dv], then y = out_proj o.
KernelStatus Finish(const GatedDeltaNetLayerShape& s, const GatedDeltaNetLayerWeights& w, float* o, const float* z,
                    int64_t n, float* y) {
  GatedRmsNormParams np;
  np.x = o;
  np.z = z;
  np.weight = w.norm;
  np.out = o;
  np.n_rows = n * s.n_v_heads;
  np.dim = s.dv;
  np.eps = s.eps;
  np.norm_before_gate = true;
  if (const int st = GatedRmsNorm(np, nullptr); st != kKernelOk) return static_cast<KernelStatus>(st);
  const int64_t value_dim = s.n_v_heads * s.dv;
  for (int64_t t = 0; t < n; ++t) MatVec(w.out_proj, o + t * value_dim, s.hidden, value_dim, y + t * s.hidden);
  return kKernelOk;
}

}  // namespace

KernelStatus CheckGatedDeltaNetLayerShape(const GatedDeltaNetLayerShape& s, const GatedDeltaNetLayerWeights& w,
                                          const char** bad_field) {
  const char* bad = nullptr;
  if (s.hidden <= 0) {
    bad = "hidden";
  } else if (const char* shape = gated_delta_internal::BadShape(s.n_k_heads, s.n_v_heads, s.dk, s.dv)) {
    bad = shape;
  } else if (s.d_conv < 1) {
    bad = "d_conv";
  } else if (!(s.eps >= 0.0f)) {
    bad = "eps";
  } else if (s.chunk_size <= 0 || (s.chunk_size & (s.chunk_size - 1)) != 0) {
    bad = "chunk_size";
  } else if (w.in_proj_qkvz != nullptr &&
             (w.in_proj_qkv != nullptr || w.in_proj_z != nullptr || w.in_proj_b != nullptr || w.in_proj_a != nullptr)) {
    bad = "in_proj_qkv";  // both forms at once
  } else if (w.in_proj_qkvz != nullptr && w.in_proj_ba == nullptr) {
    bad = "in_proj_ba";
  } else if (w.in_proj_qkvz == nullptr && w.in_proj_qkv == nullptr) {
    bad = "in_proj_qkvz";  // neither form: named by Qwen3-Next's
  } else if (w.in_proj_qkvz == nullptr && w.in_proj_z == nullptr) {
    bad = "in_proj_z";
  } else if (w.in_proj_qkvz == nullptr && w.in_proj_b == nullptr) {
    bad = "in_proj_b";
  } else if (w.in_proj_qkvz == nullptr && w.in_proj_a == nullptr) {
    bad = "in_proj_a";
  } else if (w.conv1d == nullptr) {
    bad = "conv1d";
  } else if (w.dt_bias == nullptr) {
    bad = "dt_bias";
  } else if (w.a_log == nullptr) {
    bad = "a_log";
  } else if (w.norm == nullptr) {
    bad = "norm";
  } else if (w.out_proj == nullptr) {
    bad = "out_proj";
  }
  return bad == nullptr ? kKernelOk : Fail(bad, bad_field);
}

KernelStatus GatedDeltaNetLayerPrefill(const GatedDeltaNetLayerShape& s, const GatedDeltaNetLayerWeights& w,
                                       const float* x, int64_t seqlen, int64_t start_pos, float* conv_state,
                                       float* recurrent_state, float* y,
                                       const GatedDeltaNetLayerCheckpoints& checkpoints, const char** bad_field) {
  if (const KernelStatus st = CheckGatedDeltaNetLayerShape(s, w, bad_field); st != kKernelOk) return st;
  if (seqlen < 0) return Fail("seqlen", bad_field);
  if (start_pos < 0) return Fail("start_pos", bad_field);
  if (conv_state == nullptr) return Fail("conv_state", bad_field);
  if (recurrent_state == nullptr) return Fail("recurrent_state", bad_field);
  if (seqlen == 0) return kKernelOk;
  if (x == nullptr) return Fail("x", bad_field);
  if (y == nullptr) return Fail("y", bad_field);

  const int64_t channels = GatedDeltaNetConvChannels(s);
  const int64_t key_dim = s.n_k_heads * s.dk;
  const int64_t value_dim = s.n_v_heads * s.dv;
  std::vector<float> conv_in(seqlen * channels), conv_out(seqlen * channels), z(seqlen * value_dim);
  std::vector<float> beta(seqlen * s.n_v_heads), g(seqlen * s.n_v_heads);
  Project(s, w, x, seqlen, conv_in.data(), z.data(), beta.data(), g.data());

  if (checkpoints.conv != nullptr) {
    // The conv state at boundary b: the inputs at b - (d_conv - 1) .. b - 1,
    // from this call's inputs or (before start_pos) the incoming state.
    const int64_t keep = s.d_conv - 1;
    const int64_t rows = GatedDeltaNumChunkStates(start_pos, seqlen, s.chunk_size);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t b = (start_pos / s.chunk_size + 1 + i) * s.chunk_size;
      float* out = checkpoints.conv + i * channels * keep;
      for (int64_t j = 0; j < keep; ++j) {
        const int64_t pos = b - keep + j;
        for (int64_t c = 0; c < channels; ++c) {
          out[c * keep + j] = pos >= start_pos ? conv_in[(pos - start_pos) * channels + c]
                                               : conv_state[c * keep + keep - (start_pos - pos)];
        }
      }
    }
  }

  CausalConv1dParams cp;
  cp.x = conv_in.data();
  cp.weight = w.conv1d;
  cp.conv_state = conv_state;
  cp.out = conv_out.data();
  cp.seqlen = seqlen;
  cp.channels = channels;
  cp.d_conv = s.d_conv;
  cp.silu = true;
  if (const int st = CausalConv1d(cp, nullptr); st != kKernelOk) return static_cast<KernelStatus>(st);

  std::vector<float> q(seqlen * key_dim), k(seqlen * key_dim), v(seqlen * value_dim), o(seqlen * value_dim);
  SplitQkv(s, conv_out.data(), seqlen, q.data(), k.data(), v.data());
  GatedDeltaParams gp;
  gp.q = q.data();
  gp.k = k.data();
  gp.v = v.data();
  gp.g = g.data();
  gp.beta = beta.data();
  gp.initial_state = recurrent_state;
  gp.final_state = recurrent_state;
  gp.o = o.data();
  gp.chunk_states = checkpoints.recurrent;
  gp.seqlen = seqlen;
  gp.n_k_heads = s.n_k_heads;
  gp.n_v_heads = s.n_v_heads;
  gp.dk = s.dk;
  gp.dv = s.dv;
  gp.chunk_size = s.chunk_size;
  gp.start_pos = start_pos;
  gp.l2norm_qk = true;
  const KernelStatus st = s.sequential ? GatedDeltaSequential(gp, bad_field) : GatedDeltaChunked(gp, bad_field);
  if (st != kKernelOk) return st;
  return Finish(s, w, o.data(), z.data(), seqlen, y);
}

KernelStatus GatedDeltaNetLayerDecode(const GatedDeltaNetLayerShape& s, const GatedDeltaNetLayerWeights& w,
                                      const float* x, float* conv_state, float* recurrent_state, float* y,
                                      const char** bad_field) {
  if (const KernelStatus st = CheckGatedDeltaNetLayerShape(s, w, bad_field); st != kKernelOk) return st;
  if (conv_state == nullptr) return Fail("conv_state", bad_field);
  if (recurrent_state == nullptr) return Fail("recurrent_state", bad_field);
  if (x == nullptr) return Fail("x", bad_field);
  if (y == nullptr) return Fail("y", bad_field);

  const int64_t channels = GatedDeltaNetConvChannels(s);
  const int64_t key_dim = s.n_k_heads * s.dk;
  const int64_t value_dim = s.n_v_heads * s.dv;
  std::vector<float> conv_in(channels), conv_out(channels), z(value_dim), beta(s.n_v_heads), g(s.n_v_heads);
  Project(s, w, x, 1, conv_in.data(), z.data(), beta.data(), g.data());

  CausalConv1dUpdateParams cp;
  cp.x = conv_in.data();
  cp.weight = w.conv1d;
  cp.conv_state = conv_state;
  cp.out = conv_out.data();
  cp.batch = 1;
  cp.num_slots = 1;
  cp.channels = channels;
  cp.d_conv = s.d_conv;
  cp.silu = true;
  if (const int st = CausalConv1dUpdate(cp, nullptr); st != kKernelOk) return static_cast<KernelStatus>(st);

  std::vector<float> q(key_dim), k(key_dim), v(value_dim), o(value_dim);
  SplitQkv(s, conv_out.data(), 1, q.data(), k.data(), v.data());
  GatedDeltaDecodeParams dp;
  dp.state = recurrent_state;
  dp.q = q.data();
  dp.k = k.data();
  dp.v = v.data();
  dp.g = g.data();
  dp.beta = beta.data();
  dp.o = o.data();
  dp.batch = 1;
  dp.num_slots = 1;
  dp.n_k_heads = s.n_k_heads;
  dp.n_v_heads = s.n_v_heads;
  dp.dk = s.dk;
  dp.dv = s.dv;
  dp.l2norm_qk = true;
  if (const KernelStatus st = GatedDeltaDecode(dp, bad_field); st != kKernelOk) return st;
  return Finish(s, w, o.data(), z.data(), 1, y);
}

}  // namespace hybridserve::kernels::cpu
