#include "kernels/cpu/gated_attention_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
struct Layer {
  GatedAttentionLayerShape shape;
  std::vector<float> q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  GatedAttentionLayerWeights Weights() const {
    GatedAttentionLayerWeights w;
    w.q_proj = q_proj.data();
    w.k_proj = k_proj.data();
    w.v_proj = v_proj.data();
    w.o_proj = o_proj.data();
    w.q_norm = q_norm.data();
    w.k_norm = k_norm.data();
    return w;
  }
  int64_t KvDim() const { return shape.n_kv_heads * shape.head_dim; }
};

Layer RandomLayer(std::mt19937& rng, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t hd, int64_t rot) {
  Layer l;
  l.shape.hidden = hidden;
  l.shape.n_heads = heads;
  l.shape.n_kv_heads = kv_heads;
  l.shape.head_dim = hd;
  l.shape.rotary_dim = rot;
  l.q_proj = RandomVector(rng, heads * 2 * hd * hidden, -0.5f, 0.5f);
  l.k_proj = RandomVector(rng, kv_heads * hd * hidden, -0.5f, 0.5f);
  l.v_proj = RandomVector(rng, kv_heads * hd * hidden, -0.5f, 0.5f);
  l.o_proj = RandomVector(rng, hidden * heads * hd, -0.3f, 0.3f);
  l.q_norm = RandomVector(rng, hd, -0.3f, 0.3f);
  l.k_norm = RandomVector(rng, hd, -0.3f, 0.3f);
  return l;
}

// Runs x [n, hidden] in pieces (summing to n) with one K/V cache; returns y.
std::vector<float> ForwardPieces(const Layer& l, const std::vector<float>& x, const std::vector<int64_t>& pieces) {
  int64_t n = 0;
  for (int64_t p : pieces) n += p;
  std::vector<float> y(n * l.shape.hidden), kc(n * l.KvDim()), vc(n * l.KvDim());
  int64_t at = 0;
  for (int64_t p : pieces) {
    const char* bad = nullptr;
    EXPECT_EQ(GatedAttentionLayerForward(l.shape, l.Weights(), x.data() + at * l.shape.hidden, p, at, kc.data(),
                                         vc.data(), y.data() + at * l.shape.hidden, &bad),
              kKernelOk)
        << (bad ? bad : "");
    at += p;
  }
  return y;
}

// transformers 5.23's Qwen3NextAttention, and Qwen3_5Attention with its text
// MRoPE (tools/gen_gated_attention_fixture.py): hidden 16, 4 query heads over 2
// K/V heads, head_dim 16 (Qwen3.5: 32), RoPE on the first quarter
// (partial_rotary_factor 0.25), 11 tokens, causal. Tolerance 2e-5 on outputs
// of a few units: fp32 projections summed in another order, RoPE's angles in
// double here against fp32 there, attention in double here.
void CheckAgainstFixture(const std::string& path, int64_t head_dim) {
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const size_t hd = static_cast<size_t>(head_dim);
  Layer l;
  l.shape.hidden = 16;
  l.shape.n_heads = 4;
  l.shape.n_kv_heads = 2;
  l.shape.head_dim = head_dim;
  l.shape.rotary_dim = head_dim / 4;
  l.shape.theta = 10000.0;
  l.shape.eps = 1e-6f;
  l.q_proj = JsonArray(text, "q_proj");
  l.k_proj = JsonArray(text, "k_proj");
  l.v_proj = JsonArray(text, "v_proj");
  l.o_proj = JsonArray(text, "o_proj");
  l.q_norm = JsonArray(text, "q_norm");
  l.k_norm = JsonArray(text, "k_norm");
  const std::vector<float> x = JsonArray(text, "x"), y_want = JsonArray(text, "y");
  ASSERT_EQ(l.q_proj.size(), 4u * 2u * hd * 16u);
  ASSERT_EQ(l.k_proj.size(), 2u * hd * 16u);
  ASSERT_EQ(l.v_proj.size(), l.k_proj.size());
  ASSERT_EQ(l.o_proj.size(), 16u * 4u * hd);
  ASSERT_EQ(l.q_norm.size(), hd);
  ASSERT_EQ(l.k_norm.size(), hd);
  ASSERT_EQ(x.size(), 11u * 16u);
  ASSERT_EQ(y_want.size(), x.size());
  const std::vector<float> y = ForwardPieces(l, x, {11});
  const float dy = MaxAbsDiff(y, y_want);
  std::printf("%s: gated attention vs transformers: max |diff| y %.3g\n", path.c_str(), dy);
  EXPECT_LE(dy, 2e-5f);
}

TEST(GatedAttentionLayerTest, MatchesTransformersQwen3NextAttention) {
  CheckAgainstFixture("tests/fixtures/gated_delta/attention_case.json", 16);
}

TEST(GatedAttentionLayerTest, MatchesTransformersQwen3_5Attention) {
  CheckAgainstFixture("tests/fixtures/gated_delta/attention_case_qwen3_5.json", 32);
}

// Every row depends only on its token and the cached keys and values before
// it, so any split, and decoding token by token, gives the unsplit bits.
TEST(GatedAttentionLayerTest, SplitForwardAndDecodeAreBitExact) {
  std::mt19937 rng(60);
  const Layer l = RandomLayer(rng, 12, 4, 2, 8, 4);
  const std::vector<float> x = RandomVector(rng, 19 * 12);
  const std::vector<float> whole = ForwardPieces(l, x, {19});
  for (const auto& pieces : std::vector<std::vector<int64_t>>{{1, 18}, {7, 5, 7}, {18, 1}}) {
    EXPECT_TRUE(BitsEqual(ForwardPieces(l, x, pieces), whole)) << pieces[0];
  }
  EXPECT_TRUE(BitsEqual(ForwardPieces(l, x, std::vector<int64_t>(19, 1)), whole));
}

TEST(GatedAttentionLayerTest, ArgumentChecksNameTheField) {
  std::mt19937 rng(61);
  const Layer l = RandomLayer(rng, 8, 4, 2, 8, 4);
  std::vector<float> x(8), y(8), kc(l.KvDim()), vc(l.KvDim());
  auto forward = [&](GatedAttentionLayerShape s, GatedAttentionLayerWeights w, int64_t n, int64_t start,
                     const float* xp, float* kp, float* vp, float* yp) {
    const char* bad = "";
    EXPECT_EQ(GatedAttentionLayerForward(s, w, xp, n, start, kp, vp, yp, &bad), kKernelInvalidArgument);
    return std::string(bad);
  };
  const GatedAttentionLayerWeights w = l.Weights();
  auto shape_with = [&](auto edit) {
    GatedAttentionLayerShape s = l.shape;
    edit(s);
    return forward(s, w, 1, 0, x.data(), kc.data(), vc.data(), y.data());
  };
  EXPECT_EQ(shape_with([](auto& s) { s.hidden = 0; }), "hidden");
  EXPECT_EQ(shape_with([](auto& s) { s.n_kv_heads = 0; }), "n_kv_heads");
  EXPECT_EQ(shape_with([](auto& s) { s.n_heads = 3; }), "n_heads");
  EXPECT_EQ(shape_with([](auto& s) { s.head_dim = 0; }), "head_dim");
  EXPECT_EQ(shape_with([](auto& s) { s.rotary_dim = 3; }), "rotary_dim");
  EXPECT_EQ(shape_with([](auto& s) { s.rotary_dim = 10; }), "rotary_dim");
  EXPECT_EQ(shape_with([](auto& s) { s.theta = 0.0; }), "theta");
  EXPECT_EQ(shape_with([](auto& s) { s.eps = -1.0f; }), "eps");
  auto weight_without = [&](auto edit) {
    GatedAttentionLayerWeights bad_w = w;
    edit(bad_w);
    return forward(l.shape, bad_w, 1, 0, x.data(), kc.data(), vc.data(), y.data());
  };
  EXPECT_EQ(weight_without([](auto& b) { b.q_proj = nullptr; }), "q_proj");
  EXPECT_EQ(weight_without([](auto& b) { b.k_proj = nullptr; }), "k_proj");
  EXPECT_EQ(weight_without([](auto& b) { b.v_proj = nullptr; }), "v_proj");
  EXPECT_EQ(weight_without([](auto& b) { b.o_proj = nullptr; }), "o_proj");
  EXPECT_EQ(weight_without([](auto& b) { b.q_norm = nullptr; }), "q_norm");
  EXPECT_EQ(weight_without([](auto& b) { b.k_norm = nullptr; }), "k_norm");
  EXPECT_EQ(forward(l.shape, w, -1, 0, x.data(), kc.data(), vc.data(), y.data()), "n");
  EXPECT_EQ(forward(l.shape, w, 1, -1, x.data(), kc.data(), vc.data(), y.data()), "start_pos");
  EXPECT_EQ(forward(l.shape, w, 1, 0, nullptr, kc.data(), vc.data(), y.data()), "x");
  EXPECT_EQ(forward(l.shape, w, 1, 0, x.data(), nullptr, vc.data(), y.data()), "k_cache");
  EXPECT_EQ(forward(l.shape, w, 1, 0, x.data(), kc.data(), nullptr, y.data()), "v_cache");
  EXPECT_EQ(forward(l.shape, w, 1, 0, x.data(), kc.data(), vc.data(), nullptr), "y");
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
