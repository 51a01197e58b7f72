#include "kernels/cpu/qwen_moe_block.h"

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
#include "kernels/torch_topk.h"

namespace hybridserve::kernels::cpu {
namespace {

using testing::BitsEqual;
using testing::JsonArray;
using testing::MaxAbsDiff;
using testing::RandomVector;
using testing::ReadTextFile;
struct Block {
  QwenMoeBlockShape shape;
  std::vector<float> router, experts_gate_up, experts_down, shared_gate_proj, shared_up_proj, shared_down_proj,
      shared_expert_gate;
  QwenMoeBlockWeights Weights() const {
    QwenMoeBlockWeights w;
    w.router = router.data();
    w.experts_gate_up = experts_gate_up.data();
    w.experts_down = experts_down.data();
    w.shared_gate_proj = shared_gate_proj.data();
    w.shared_up_proj = shared_up_proj.data();
    w.shared_down_proj = shared_down_proj.data();
    w.shared_expert_gate = shared_expert_gate.data();
    return w;
  }
};

Block RandomBlock(std::mt19937& rng, int64_t hidden, int64_t experts, int64_t top_k, int64_t inter, int64_t shared) {
  Block b;
  b.shape.hidden = hidden;
  b.shape.num_experts = experts;
  b.shape.top_k = top_k;
  b.shape.moe_intermediate = inter;
  b.shape.shared_intermediate = shared;
  b.router = RandomVector(rng, experts * hidden);
  b.experts_gate_up = RandomVector(rng, experts * 2 * inter * hidden, -0.5f, 0.5f);
  b.experts_down = RandomVector(rng, experts * hidden * inter, -0.5f, 0.5f);
  b.shared_gate_proj = RandomVector(rng, shared * hidden, -0.5f, 0.5f);
  b.shared_up_proj = RandomVector(rng, shared * hidden, -0.5f, 0.5f);
  b.shared_down_proj = RandomVector(rng, hidden * shared, -0.5f, 0.5f);
  b.shared_expert_gate = RandomVector(rng, hidden, -0.5f, 0.5f);
  return b;
}

struct Result {
  std::vector<float> y, chosen_weight;
  std::vector<int32_t> chosen;
};

Result Forward(const Block& b, const float* x, int64_t n) {
  Result r;
  r.y.resize(n * b.shape.hidden);
  r.chosen.resize(n * b.shape.top_k);
  r.chosen_weight.resize(n * b.shape.top_k);
  const char* bad = nullptr;
  EXPECT_EQ(QwenMoeBlockForward(b.shape, b.Weights(), x, n, r.y.data(), r.chosen.data(), r.chosen_weight.data(), &bad),
            kKernelOk)
      << (bad ? bad : "");
  return r;
}
// transformers 5.23's Qwen3NextSparseMoeBlock (norm_topk_prob false) and
// Qwen3_5MoeSparseMoeBlock (renormalised), tools/gen_qwen_moe_fixture.py:
// hidden 32, 8 experts, top-k 2, expert width 16, shared width 24, 12 rows,
// the last all zeros (all 8 probabilities tie). The chosen experts must be
// torch's exactly (ties included); weights within 1e-6 and outputs (a few
// units) within 1e-5: fp32 dot products summed in another order (BLAS there)
// and another exp (softmax, SiLU, sigmoid).
void CheckAgainstFixture(const std::string& path, bool norm_topk_prob) {
  const std::string text = ReadTextFile(path);
  Block b;
  b.shape.hidden = 32;
  b.shape.num_experts = 8;
  b.shape.top_k = 2;
  b.shape.moe_intermediate = 16;
  b.shape.shared_intermediate = 24;
  b.shape.norm_topk_prob = norm_topk_prob;
  ASSERT_NE(text.find(std::string("\"norm_topk_prob\": ") + (norm_topk_prob ? "true" : "false")), std::string::npos);
  b.router = JsonArray(text, "router");
  b.experts_gate_up = JsonArray(text, "experts_gate_up");
  b.experts_down = JsonArray(text, "experts_down");
  b.shared_gate_proj = JsonArray(text, "shared_gate_proj");
  b.shared_up_proj = JsonArray(text, "shared_up_proj");
  b.shared_down_proj = JsonArray(text, "shared_down_proj");
  b.shared_expert_gate = JsonArray(text, "shared_expert_gate");
  const std::vector<float> x = JsonArray(text, "x"), y_want = JsonArray(text, "y");
  const std::vector<float> chosen_want = JsonArray(text, "chosen"), weight_want = JsonArray(text, "chosen_weight");
  ASSERT_EQ(b.router.size(), 8u * 32u);
  ASSERT_EQ(b.experts_gate_up.size(), 8u * 2u * 16u * 32u);
  ASSERT_EQ(b.experts_down.size(), 8u * 32u * 16u);
  ASSERT_EQ(b.shared_gate_proj.size(), 24u * 32u);
  ASSERT_EQ(b.shared_up_proj.size(), 24u * 32u);
  ASSERT_EQ(b.shared_down_proj.size(), 32u * 24u);
  ASSERT_EQ(b.shared_expert_gate.size(), 32u);
  ASSERT_EQ(x.size(), 12u * 32u);
  ASSERT_EQ(y_want.size(), x.size());
  ASSERT_EQ(chosen_want.size(), 12u * 2u);
  ASSERT_EQ(weight_want.size(), chosen_want.size());
  const Result r = Forward(b, x.data(), 12);
  for (size_t i = 0; i < chosen_want.size(); ++i) {
    EXPECT_EQ(r.chosen[i], static_cast<int32_t>(chosen_want[i])) << "row " << i / 2 << " choice " << i % 2;
  }
  const float dw = MaxAbsDiff(r.chosen_weight, weight_want);
  const float dy = MaxAbsDiff(r.y, y_want);
  std::printf("%s: moe block vs transformers: max |diff| weights %.3g, y %.3g\n", path.c_str(), dw, dy);
  EXPECT_LE(dw, 1e-6f);
  EXPECT_LE(dy, 1e-5f);
}

TEST(QwenMoeBlockTest, MatchesTransformersQwen3NextSparseMoeBlock) {
  CheckAgainstFixture("tests/fixtures/gated_delta/moe_case.json", /*norm_topk_prob=*/false);
}

TEST(QwenMoeBlockTest, MatchesTransformersQwen3_5MoeSparseMoeBlock) {
  CheckAgainstFixture("tests/fixtures/gated_delta/moe_case_qwen3_5.json", /*norm_topk_prob=*/true);
}

// torch.topk's indices on tied probabilities (8 to 512 experts, both of its
// CPU algorithms), exactly.
TEST(QwenMoeBlockTest, TopKBreaksTiesAsTorchTopK) {
  const std::string text = ReadTextFile("tests/fixtures/gated_delta/moe_case.json");
  size_t at = text.find("\"topk_ties\"");
  ASSERT_NE(at, std::string::npos);
  int cases = 0;
  while (true) {
    size_t from = at;
    const std::vector<float> p = JsonArray(text, "p", &from);
    if (p.empty()) break;
    const std::vector<float> want = JsonArray(text, "indices", &from);
    at = from;
    const int64_t k = static_cast<int64_t>(want.size());
    ASSERT_GE(k, 1);
    std::vector<int32_t> got(k);
    kernels::TorchTopKIndices(p.data(), static_cast<int64_t>(p.size()), k, got.data());
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(got[j], static_cast<int32_t>(want[j])) << "n " << p.size() << " k " << k << " place " << j;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 10);
}

// Each row's bits depend on that row only: alone, in a batch, or in a batch
// in another order, the same bits (routing included).
TEST(QwenMoeBlockTest, RowAloneEqualsRowInBatchBitExact) {
  std::mt19937 rng(62);
  const Block b = RandomBlock(rng, 24, 16, 4, 12, 20);
  const int64_t n = 13, h = 24;
  const std::vector<float> x = RandomVector(rng, n * h);
  const Result batch = Forward(b, x.data(), n);
  std::vector<float> reversed_x;
  for (int64_t r = n - 1; r >= 0; --r) reversed_x.insert(reversed_x.end(), x.begin() + r * h, x.begin() + (r + 1) * h);
  const Result reversed = Forward(b, reversed_x.data(), n);
  for (int64_t r = 0; r < n; ++r) {
    const Result alone = Forward(b, x.data() + r * h, 1);
    const std::vector<float> in_batch(batch.y.begin() + r * h, batch.y.begin() + (r + 1) * h);
    const std::vector<float> in_reversed(reversed.y.begin() + (n - 1 - r) * h, reversed.y.begin() + (n - r) * h);
    EXPECT_TRUE(BitsEqual(alone.y, in_batch)) << "row " << r;
    EXPECT_TRUE(BitsEqual(alone.y, in_reversed)) << "row " << r;
    EXPECT_TRUE(std::equal(alone.chosen.begin(), alone.chosen.end(), batch.chosen.begin() + r * 4)) << "row " << r;
  }
}

TEST(QwenMoeBlockTest, ArgumentChecksNameTheField) {
  std::mt19937 rng(63);
  const Block b = RandomBlock(rng, 8, 4, 2, 4, 6);
  std::vector<float> x(8), y(8);
  auto forward = [&](QwenMoeBlockShape s, QwenMoeBlockWeights w, const float* xp, int64_t n, float* yp) {
    const char* bad = "";
    EXPECT_EQ(QwenMoeBlockForward(s, w, xp, n, yp, nullptr, nullptr, &bad), kKernelInvalidArgument);
    return std::string(bad);
  };
  const QwenMoeBlockWeights w = b.Weights();
  auto shape_with = [&](auto edit) {
    QwenMoeBlockShape s = b.shape;
    edit(s);
    return forward(s, w, x.data(), 1, y.data());
  };
  EXPECT_EQ(shape_with([](auto& s) { s.hidden = 0; }), "hidden");
  EXPECT_EQ(shape_with([](auto& s) { s.num_experts = 0; }), "num_experts");
  EXPECT_EQ(shape_with([](auto& s) { s.top_k = 0; }), "top_k");
  EXPECT_EQ(shape_with([](auto& s) { s.top_k = 5; }), "top_k");
  EXPECT_EQ(shape_with([](auto& s) { s.moe_intermediate = 0; }), "moe_intermediate");
  EXPECT_EQ(shape_with([](auto& s) { s.shared_intermediate = -1; }), "shared_intermediate");
  auto weight_without = [&](auto edit) {
    QwenMoeBlockWeights bad_w = w;
    edit(bad_w);
    return forward(b.shape, bad_w, x.data(), 1, y.data());
  };
  EXPECT_EQ(weight_without([](auto& v) { v.router = nullptr; }), "router");
  EXPECT_EQ(weight_without([](auto& v) { v.experts_gate_up = nullptr; }), "experts_gate_up");
  EXPECT_EQ(weight_without([](auto& v) { v.experts_down = nullptr; }), "experts_down");
  EXPECT_EQ(weight_without([](auto& v) { v.shared_gate_proj = nullptr; }), "shared_gate_proj");
  EXPECT_EQ(weight_without([](auto& v) { v.shared_up_proj = nullptr; }), "shared_up_proj");
  EXPECT_EQ(weight_without([](auto& v) { v.shared_down_proj = nullptr; }), "shared_down_proj");
  EXPECT_EQ(weight_without([](auto& v) { v.shared_expert_gate = nullptr; }), "shared_expert_gate");
  EXPECT_EQ(forward(b.shape, w, x.data(), -1, y.data()), "n");
  EXPECT_EQ(forward(b.shape, w, nullptr, 1, y.data()), "x");
  EXPECT_EQ(forward(b.shape, w, x.data(), 1, nullptr), "y");
  EXPECT_EQ(forward(b.shape, w, x.data(), 1, x.data()), "y");
  // n = 0 writes nothing and succeeds, even with null buffers.
  EXPECT_EQ(QwenMoeBlockForward(b.shape, w, nullptr, 0, nullptr), kKernelOk);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
