#include "kernels/cpu/gated_deltanet_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace hybridserve::kernels::cpu {
namespace {

using testing::BitsEqual;
using testing::JsonArray;
using testing::MaxAbsDiff;
using testing::RandomVector;
float MaxAbs(const std::vector<float>& a) {
  float m = 0.0f;
  for (float x : a) m = std::max(m, std::fabs(x));
  return m;
}

// A layer's weights, owned.
struct Layer {
  GatedDeltaNetLayerShape shape;
  // Qwen3-Next's projections (qkvz, ba) or, when qkvz is empty, Qwen3.5's.
  std::vector<float> qkvz, ba, qkv, z, b, a, conv, dt_bias, a_log, norm, out_proj;
  GatedDeltaNetLayerWeights Weights() const {
    GatedDeltaNetLayerWeights w;
    if (!qkvz.empty()) {
      w.in_proj_qkvz = qkvz.data();
      w.in_proj_ba = ba.data();
    } else {
      w.in_proj_qkv = qkv.data();
      w.in_proj_z = z.data();
      w.in_proj_b = b.data();
      w.in_proj_a = a.data();
    }
    w.conv1d = conv.data();
    w.dt_bias = dt_bias.data();
    w.a_log = a_log.data();
    w.norm = norm.data();
    w.out_proj = out_proj.data();
    return w;
  }
  int64_t Channels() const { return GatedDeltaNetConvChannels(shape); }
  int64_t StateSize() const { return shape.n_v_heads * shape.dk * shape.dv; }
};

Layer RandomLayer(std::mt19937& rng, int64_t hidden, int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  Layer l;
  l.shape.hidden = hidden;
  l.shape.n_k_heads = hk;
  l.shape.n_v_heads = hv;
  l.shape.dk = dk;
  l.shape.dv = dv;
  const int64_t r = hv / hk;
  l.qkvz = RandomVector(rng, hk * (2 * dk + 2 * r * dv) * hidden, -0.5f, 0.5f);
  l.ba = RandomVector(rng, hk * 2 * r * hidden, -0.5f, 0.5f);
  l.conv = RandomVector(rng, l.Channels() * l.shape.d_conv, -0.8f, 0.8f);
  l.dt_bias = RandomVector(rng, hv, -0.5f, 0.5f);
  l.a_log = RandomVector(rng, hv, -2.0f, 0.5f);
  l.norm = RandomVector(rng, dv, 0.5f, 1.5f);
  l.out_proj = RandomVector(rng, hidden * hv * dv, -0.3f, 0.3f);
  return l;
}

struct LayerRun {
  std::vector<float> y, conv_state, state;
};

// Prefills x [n, hidden] in pieces of the given lengths (summing to n) from
// zero states, carrying the states.
LayerRun PrefillPieces(const Layer& l, const std::vector<float>& x, const std::vector<int64_t>& pieces) {
  LayerRun run;
  int64_t n = 0;
  for (int64_t p : pieces) n += p;
  run.y.assign(n * l.shape.hidden, 0.0f);
  run.conv_state.assign(l.Channels() * (l.shape.d_conv - 1), 0.0f);
  run.state.assign(l.StateSize(), 0.0f);
  int64_t at = 0;
  for (int64_t p : pieces) {
    const char* bad = nullptr;
    EXPECT_EQ(
        GatedDeltaNetLayerPrefill(l.shape, l.Weights(), x.data() + at * l.shape.hidden, p, at, run.conv_state.data(),
                                  run.state.data(), run.y.data() + at * l.shape.hidden, {}, &bad),
        kKernelOk)
        << (bad ? bad : "");
    at += p;
  }
  return run;
}

// transformers 5.23's Qwen3NextGatedDeltaNet and Qwen3_5GatedDeltaNet
// (tools/gen_gated_deltanet_layer_fixture.py): hidden 16, 2 key heads for 4
// value heads, dk 8, dv 6, conv 4, 19 tokens from zero states. Run with the
// chunk transformers uses (64: one partial chunk), a grid of 8 (three chunks)
// and the sequential oracle. Tolerance 2e-5 on y and both states: fp32 with a
// different op order (projections summed in another order, expf/log1pf against
// torch's vectorised ones, the chunked rule's triangular solve) on values of at
// most a few units (the measured worst difference is printed). Then the same
// against transformers' cached run (prefill, then its one-token decode path).
void CheckAgainstFixture(const std::string& path, bool qwen3_5) {
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  Layer l;
  l.shape.hidden = 16;
  l.shape.n_k_heads = 2;
  l.shape.n_v_heads = 4;
  l.shape.dk = 8;
  l.shape.dv = 6;
  l.shape.d_conv = 4;
  l.shape.eps = 1e-6f;
  if (qwen3_5) {
    l.qkv = JsonArray(text, "in_proj_qkv");
    l.z = JsonArray(text, "in_proj_z");
    l.b = JsonArray(text, "in_proj_b");
    l.a = JsonArray(text, "in_proj_a");
    ASSERT_EQ(l.qkv.size(), static_cast<size_t>(l.Channels() * 16));
    ASSERT_EQ(l.z.size(), 24u * 16u);
    ASSERT_EQ(l.b.size(), 4u * 16u);
    ASSERT_EQ(l.a.size(), 4u * 16u);
  } else {
    l.qkvz = JsonArray(text, "in_proj_qkvz");
    l.ba = JsonArray(text, "in_proj_ba");
    ASSERT_EQ(l.qkvz.size(), 2u * (2 * 8 + 2 * 2 * 6) * 16u);
    ASSERT_EQ(l.ba.size(), 2u * 4u * 16u);
  }
  l.conv = JsonArray(text, "conv1d");
  l.dt_bias = JsonArray(text, "dt_bias");
  l.a_log = JsonArray(text, "A_log");
  l.norm = JsonArray(text, "norm");
  l.out_proj = JsonArray(text, "out_proj");
  const std::vector<float> x = JsonArray(text, "x"), y_want = JsonArray(text, "y"),
                           conv_want = JsonArray(text, "conv_state"), state_want = JsonArray(text, "recurrent_state");
  constexpr int64_t kN = 19;
  ASSERT_EQ(l.conv.size(), static_cast<size_t>(l.Channels() * 4));
  ASSERT_EQ(l.dt_bias.size(), 4u);
  ASSERT_EQ(l.a_log.size(), 4u);
  ASSERT_EQ(l.norm.size(), 6u);
  ASSERT_EQ(l.out_proj.size(), 16u * 24u);
  ASSERT_EQ(x.size(), kN * 16u);
  ASSERT_EQ(y_want.size(), x.size());
  ASSERT_EQ(conv_want.size(), static_cast<size_t>(l.Channels() * 3));
  ASSERT_EQ(state_want.size(), static_cast<size_t>(l.StateSize()));
  std::printf("%s: max |y| %.3g, max |state| %.3g\n", path.c_str(), MaxAbs(y_want), MaxAbs(state_want));
  for (const int64_t chunk : {64, 8, 0}) {
    SCOPED_TRACE(chunk == 0 ? "sequential" : "chunk " + std::to_string(chunk));
    l.shape.sequential = chunk == 0;
    l.shape.chunk_size = chunk == 0 ? 64 : chunk;
    const LayerRun run = PrefillPieces(l, x, {kN});
    const float dy = MaxAbsDiff(run.y, y_want), dc = MaxAbsDiff(run.conv_state, conv_want),
                ds = MaxAbsDiff(run.state, state_want);
    std::printf("chunk %lld vs transformers: max |diff| y %.3g conv state %.3g state %.3g\n",
                static_cast<long long>(chunk), dy, dc, ds);
    EXPECT_LE(dy, 2e-5f);
    EXPECT_LE(dc, 2e-5f);
    EXPECT_LE(ds, 2e-5f);
  }
  // transformers' cached run: prefill 15 tokens, then 4 decode steps on its
  // decode path; the states after the prefill and at the end, as handed on.
  const std::vector<float> cached_y = JsonArray(text, "cached_y"),
                           pre_conv = JsonArray(text, "cached_prefill_conv_state"),
                           pre_state = JsonArray(text, "cached_prefill_recurrent_state"),
                           end_conv = JsonArray(text, "cached_conv_state"),
                           end_state = JsonArray(text, "cached_recurrent_state");
  ASSERT_EQ(cached_y.size(), y_want.size());
  ASSERT_EQ(pre_conv.size(), conv_want.size());
  ASSERT_EQ(end_conv.size(), conv_want.size());
  ASSERT_EQ(pre_state.size(), state_want.size());
  ASSERT_EQ(end_state.size(), state_want.size());
  constexpr int64_t kPrefill = 15;
  for (const int64_t chunk : {64, 8, 0}) {
    SCOPED_TRACE(chunk == 0 ? "cached, sequential" : "cached, chunk " + std::to_string(chunk));
    l.shape.sequential = chunk == 0;
    l.shape.chunk_size = chunk == 0 ? 64 : chunk;
    LayerRun run = PrefillPieces(l, std::vector<float>(x.begin(), x.begin() + kPrefill * 16), {kPrefill});
    const float dpc = MaxAbsDiff(run.conv_state, pre_conv), dps = MaxAbsDiff(run.state, pre_state);
    run.y.resize(kN * 16);
    for (int64_t t = kPrefill; t < kN; ++t) {
      ASSERT_EQ(GatedDeltaNetLayerDecode(l.shape, l.Weights(), x.data() + t * 16, run.conv_state.data(),
                                         run.state.data(), run.y.data() + t * 16),
                kKernelOk);
    }
    const float dy = MaxAbsDiff(run.y, cached_y), dc = MaxAbsDiff(run.conv_state, end_conv),
                ds = MaxAbsDiff(run.state, end_state);
    std::printf("cached chunk %lld: max |diff| prefill conv %.3g state %.3g; y %.3g end conv %.3g state %.3g\n",
                static_cast<long long>(chunk), dpc, dps, dy, dc, ds);
    EXPECT_LE(dpc, 2e-5f);
    EXPECT_LE(dps, 2e-5f);
    EXPECT_LE(dy, 2e-5f);
    EXPECT_LE(dc, 2e-5f);
    EXPECT_LE(ds, 2e-5f);
  }
}

TEST(GatedDeltaNetLayerTest, MatchesTransformersQwen3NextLayer) {
  CheckAgainstFixture("tests/fixtures/gated_delta/layer_case.json", false);
}

TEST(GatedDeltaNetLayerTest, MatchesTransformersQwen3_5Layer) {
  CheckAgainstFixture("tests/fixtures/gated_delta/layer_case_qwen3_5.json", true);
}

// A prefill split on the chunk grid and continued from the carried states gives
// the unsplit run's bits (the chunked rule's contract; the conv and the
// projections are per token). With the sequential rule, any split is exact.
TEST(GatedDeltaNetLayerTest, SplitPrefillOnTheGridIsBitExact) {
  std::mt19937 rng(50);
  Layer l = RandomLayer(rng, 12, 2, 4, 8, 4);
  l.shape.chunk_size = 8;
  const std::vector<float> x = RandomVector(rng, 37 * 12);
  const LayerRun whole = PrefillPieces(l, x, {37});
  for (const auto& pieces : std::vector<std::vector<int64_t>>{{8, 29}, {16, 8, 13}, {32, 5}, {24, 8, 5}}) {
    const LayerRun split = PrefillPieces(l, x, pieces);
    EXPECT_TRUE(BitsEqual(split.y, whole.y)) << pieces[0];
    EXPECT_TRUE(BitsEqual(split.conv_state, whole.conv_state)) << pieces[0];
    EXPECT_TRUE(BitsEqual(split.state, whole.state)) << pieces[0];
  }
  l.shape.sequential = true;
  const LayerRun seq_whole = PrefillPieces(l, x, {37});
  for (const auto& pieces : std::vector<std::vector<int64_t>>{{1, 36}, {13, 11, 13}, {3, 30, 4}}) {
    const LayerRun split = PrefillPieces(l, x, pieces);
    EXPECT_TRUE(BitsEqual(split.y, seq_whole.y)) << pieces[0];
    EXPECT_TRUE(BitsEqual(split.conv_state, seq_whole.conv_state)) << pieces[0];
    EXPECT_TRUE(BitsEqual(split.state, seq_whole.state)) << pieces[0];
  }
}

// Qwen3-Next-80B's head shapes (16 key heads of 128 serving 32 value heads of
// 128, conv 4, chunk 64; a small hidden to keep the projections cheap): a split
// on the grid is bit-exact, and two decode steps agree with the unsplit chunked
// prefill within 2e-6 on the state and 2e-6 * max |y| on y (outputs reach ~24
// here; measured 1.1e-5 = 4.6e-7 relative).
TEST(GatedDeltaNetLayerTest, Qwen3NextHeadShapes) {
  std::mt19937 rng(55);
  Layer l = RandomLayer(rng, 32, 16, 32, 128, 128);
  l.shape.chunk_size = 64;
  constexpr int64_t kN = 72;
  const std::vector<float> x = RandomVector(rng, kN * 32);
  const LayerRun whole = PrefillPieces(l, x, {kN});
  const LayerRun split = PrefillPieces(l, x, {64, 8});
  EXPECT_TRUE(BitsEqual(split.y, whole.y));
  EXPECT_TRUE(BitsEqual(split.state, whole.state));
  EXPECT_TRUE(BitsEqual(split.conv_state, whole.conv_state));
  for (float v : whole.y) ASSERT_TRUE(std::isfinite(v));
  LayerRun run = PrefillPieces(l, std::vector<float>(x.begin(), x.begin() + (kN - 2) * 32), {kN - 2});
  run.y.resize(kN * 32);
  for (int64_t t = kN - 2; t < kN; ++t) {
    ASSERT_EQ(GatedDeltaNetLayerDecode(l.shape, l.Weights(), x.data() + t * 32, run.conv_state.data(), run.state.data(),
                                       run.y.data() + t * 32),
              kKernelOk);
  }
  const float dy = MaxAbsDiff(run.y, whole.y), ds = MaxAbsDiff(run.state, whole.state);
  std::printf("head shapes: decode vs prefill max |diff| y %.3g state %.3g (max |y| %.3g)\n", dy, ds, MaxAbs(whole.y));
  EXPECT_LE(dy, 2e-6f * MaxAbs(whole.y));
  EXPECT_LE(ds, 2e-6f);
}

// The checkpoints a prefill writes at the grid boundaries are, bit for bit, the
// states a prefill ending there returns, and continuing from one gives the
// uninterrupted run's rows. The call starts at 6 (mid-chunk, with a carried conv
// state), so the conv checkpoint at 8 takes a column from the incoming state.
TEST(GatedDeltaNetLayerTest, GridCheckpointsAreExactRestorePoints) {
  std::mt19937 rng(54);
  Layer l = RandomLayer(rng, 12, 2, 4, 8, 4);
  l.shape.chunk_size = 8;
  constexpr int64_t kN = 37, kFirst = 6, kRows = 4;  // boundaries 8, 16, 24, 32
  const std::vector<float> x = RandomVector(rng, kN * 12);
  const int64_t conv_size = l.Channels() * (l.shape.d_conv - 1);
  LayerRun run = PrefillPieces(l, x, {kFirst});
  run.y.resize(kN * 12);
  std::vector<float> ck_state(kRows * l.StateSize(), -7.0f), ck_conv(kRows * conv_size, -7.0f);
  GatedDeltaNetLayerCheckpoints ck;
  ck.recurrent = ck_state.data();
  ck.conv = ck_conv.data();
  ASSERT_EQ(GatedDeltaNetLayerPrefill(l.shape, l.Weights(), x.data() + kFirst * 12, kN - kFirst, kFirst,
                                      run.conv_state.data(), run.state.data(), run.y.data() + kFirst * 12, ck),
            kKernelOk);
  for (int64_t i = 0; i < kRows; ++i) {
    const int64_t b = (i + 1) * 8;
    SCOPED_TRACE("boundary " + std::to_string(b));
    const LayerRun upto = PrefillPieces(l, x, {kFirst, b - kFirst});
    EXPECT_TRUE(BitsEqual(ck_state.data() + i * l.StateSize(), upto.state.data(), l.StateSize()));
    EXPECT_TRUE(BitsEqual(ck_conv.data() + i * conv_size, upto.conv_state.data(), conv_size));
    std::vector<float> conv(ck_conv.begin() + i * conv_size, ck_conv.begin() + (i + 1) * conv_size);
    std::vector<float> state(ck_state.begin() + i * l.StateSize(), ck_state.begin() + (i + 1) * l.StateSize());
    std::vector<float> y((kN - b) * 12);
    ASSERT_EQ(GatedDeltaNetLayerPrefill(l.shape, l.Weights(), x.data() + b * 12, kN - b, b, conv.data(), state.data(),
                                        y.data()),
              kKernelOk);
    EXPECT_TRUE(BitsEqual(y.data(), run.y.data() + b * 12, (kN - b) * 12));
    EXPECT_TRUE(BitsEqual(state, run.state));
    EXPECT_TRUE(BitsEqual(conv, run.conv_state));
  }
}

// Off the grid the chunked rule's first chunk is partial, a different fp32 op
// order: equal within 2e-6 (values of a few units, measured <= 1.8e-7; an
// algebra slip moves them by >= 1e-3).
TEST(GatedDeltaNetLayerTest, SplitPrefillOffTheGridMatches) {
  std::mt19937 rng(51);
  Layer l = RandomLayer(rng, 12, 2, 4, 8, 4);
  l.shape.chunk_size = 8;
  const std::vector<float> x = RandomVector(rng, 37 * 12);
  const LayerRun whole = PrefillPieces(l, x, {37});
  for (const auto& pieces : std::vector<std::vector<int64_t>>{{5, 32}, {13, 11, 13}, {1, 1, 35}}) {
    const LayerRun split = PrefillPieces(l, x, pieces);
    const float dy = MaxAbsDiff(split.y, whole.y), ds = MaxAbsDiff(split.state, whole.state);
    std::printf("split at %lld: max |diff| y %.3g state %.3g\n", static_cast<long long>(pieces[0]), dy, ds);
    EXPECT_LE(dy, 2e-6f);
    EXPECT_LE(ds, 2e-6f);
    EXPECT_TRUE(BitsEqual(split.conv_state, whole.conv_state));
  }
}

// Decode steps after a prefill give, bit for bit, the rows and states of a
// sequential prefill over all the tokens; against the chunked prefill they agree
// within 2e-6 (measured 1.8e-7).
TEST(GatedDeltaNetLayerTest, DecodeEqualsPrefillRows) {
  std::mt19937 rng(52);
  Layer l = RandomLayer(rng, 12, 1, 3, 8, 4);
  l.shape.chunk_size = 8;
  constexpr int64_t kN = 21, kPrompt = 11;
  const std::vector<float> x = RandomVector(rng, kN * 12);
  for (const bool sequential : {true, false}) {
    SCOPED_TRACE(sequential ? "sequential" : "chunked");
    l.shape.sequential = sequential;
    const LayerRun whole = PrefillPieces(l, x, {kN});
    LayerRun run = PrefillPieces(l, std::vector<float>(x.begin(), x.begin() + kPrompt * 12), {kPrompt});
    run.y.resize(kN * 12);
    for (int64_t t = kPrompt; t < kN; ++t) {
      const char* bad = nullptr;
      ASSERT_EQ(GatedDeltaNetLayerDecode(l.shape, l.Weights(), x.data() + t * 12, run.conv_state.data(),
                                         run.state.data(), run.y.data() + t * 12, &bad),
                kKernelOk)
          << (bad ? bad : "");
    }
    EXPECT_TRUE(BitsEqual(run.conv_state, whole.conv_state));
    if (sequential) {
      EXPECT_TRUE(BitsEqual(run.y, whole.y));
      EXPECT_TRUE(BitsEqual(run.state, whole.state));
    } else {
      const float dy = MaxAbsDiff(run.y, whole.y), ds = MaxAbsDiff(run.state, whole.state);
      std::printf("decode vs chunked prefill: max |diff| y %.3g state %.3g\n", dy, ds);
      EXPECT_LE(dy, 2e-6f);
      EXPECT_LE(ds, 2e-6f);
    }
  }
}

TEST(GatedDeltaNetLayerTest, ArgumentChecksNameTheField) {
  std::mt19937 rng(53);
  const Layer l = RandomLayer(rng, 8, 2, 4, 4, 4);
  std::vector<float> x(8), y(8), conv(l.Channels() * 3), state(l.StateSize());
  auto prefill = [&](GatedDeltaNetLayerShape s, GatedDeltaNetLayerWeights w, int64_t seqlen, int64_t start, float* cs,
                     float* rs, const float* xp, float* yp) {
    const char* bad = "";
    const KernelStatus st = GatedDeltaNetLayerPrefill(s, w, xp, seqlen, start, cs, rs, yp, {}, &bad);
    EXPECT_EQ(st, kKernelInvalidArgument);
    return std::string(bad);
  };
  const GatedDeltaNetLayerWeights w = l.Weights();
  auto shape_with = [&](auto edit) {
    GatedDeltaNetLayerShape s = l.shape;
    edit(s);
    return prefill(s, w, 1, 0, conv.data(), state.data(), x.data(), y.data());
  };
  EXPECT_EQ(shape_with([](auto& s) { s.hidden = 0; }), "hidden");
  EXPECT_EQ(shape_with([](auto& s) { s.n_k_heads = 0; }), "n_k_heads");
  EXPECT_EQ(shape_with([](auto& s) { s.n_v_heads = 3; }), "n_v_heads");
  EXPECT_EQ(shape_with([](auto& s) { s.dk = 0; }), "dk");
  EXPECT_EQ(shape_with([](auto& s) { s.dv = -1; }), "dv");
  EXPECT_EQ(shape_with([](auto& s) { s.d_conv = 0; }), "d_conv");
  EXPECT_EQ(shape_with([](auto& s) { s.eps = -1.0f; }), "eps");
  EXPECT_EQ(shape_with([](auto& s) { s.chunk_size = 12; }), "chunk_size");
  auto weight_without = [&](auto edit) {
    GatedDeltaNetLayerWeights bad_w = w;
    edit(bad_w);
    return prefill(l.shape, bad_w, 1, 0, conv.data(), state.data(), x.data(), y.data());
  };
  EXPECT_EQ(weight_without([](auto& b) { b.in_proj_qkvz = nullptr; }), "in_proj_qkvz");
  EXPECT_EQ(weight_without([](auto& b) { b.in_proj_ba = nullptr; }), "in_proj_ba");
  EXPECT_EQ(weight_without([&](auto& b) { b.in_proj_z = x.data(); }), "in_proj_qkv");  // both forms
  {
    GatedDeltaNetLayerWeights split = w;
    split.in_proj_qkvz = nullptr;
    split.in_proj_ba = nullptr;
    const std::vector<float> m(1024);
    split.in_proj_qkv = split.in_proj_z = split.in_proj_b = split.in_proj_a = m.data();
    auto split_without = [&](auto edit) {
      GatedDeltaNetLayerWeights bad_w = split;
      edit(bad_w);
      return prefill(l.shape, bad_w, 1, 0, conv.data(), state.data(), x.data(), y.data());
    };
    EXPECT_EQ(split_without([](auto& b) { b.in_proj_qkv = nullptr; }), "in_proj_qkvz");
    EXPECT_EQ(split_without([](auto& b) { b.in_proj_z = nullptr; }), "in_proj_z");
    EXPECT_EQ(split_without([](auto& b) { b.in_proj_b = nullptr; }), "in_proj_b");
    EXPECT_EQ(split_without([](auto& b) { b.in_proj_a = nullptr; }), "in_proj_a");
  }
  EXPECT_EQ(weight_without([](auto& b) { b.conv1d = nullptr; }), "conv1d");
  EXPECT_EQ(weight_without([](auto& b) { b.dt_bias = nullptr; }), "dt_bias");
  EXPECT_EQ(weight_without([](auto& b) { b.a_log = nullptr; }), "a_log");
  EXPECT_EQ(weight_without([](auto& b) { b.norm = nullptr; }), "norm");
  EXPECT_EQ(weight_without([](auto& b) { b.out_proj = nullptr; }), "out_proj");
  EXPECT_EQ(prefill(l.shape, w, -1, 0, conv.data(), state.data(), x.data(), y.data()), "seqlen");
  EXPECT_EQ(prefill(l.shape, w, 1, -1, conv.data(), state.data(), x.data(), y.data()), "start_pos");
  EXPECT_EQ(prefill(l.shape, w, 1, 0, nullptr, state.data(), x.data(), y.data()), "conv_state");
  EXPECT_EQ(prefill(l.shape, w, 1, 0, conv.data(), nullptr, x.data(), y.data()), "recurrent_state");
  EXPECT_EQ(prefill(l.shape, w, 1, 0, conv.data(), state.data(), nullptr, y.data()), "x");
  EXPECT_EQ(prefill(l.shape, w, 1, 0, conv.data(), state.data(), x.data(), nullptr), "y");
  const char* bad = "";
  EXPECT_EQ(GatedDeltaNetLayerDecode(l.shape, w, nullptr, conv.data(), state.data(), y.data(), &bad),
            kKernelInvalidArgument);
  EXPECT_STREQ(bad, "x");
  EXPECT_EQ(GatedDeltaNetLayerDecode(l.shape, w, x.data(), nullptr, state.data(), y.data(), &bad),
            kKernelInvalidArgument);
  EXPECT_STREQ(bad, "conv_state");
  // Nothing to do is fine, and the states are left alone.
  EXPECT_EQ(GatedDeltaNetLayerPrefill(l.shape, w, nullptr, 0, 0, conv.data(), state.data(), nullptr), kKernelOk);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
