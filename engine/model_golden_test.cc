// The engine against Hugging Face transformers 5.23 (fp32, CPU) on the golden
// fixtures (DESIGN.md section 5, contract 5; tools/README.md).
//
// Tolerance: 1e-4 absolute on logits. The fixtures' logits reach |4.1|
// (golden.json max_abs_logit), so 1e-4 is ~2.4e-5 of the largest logit: room
// for fp32 summation-order differences between our kernels and torch's
// (expected ~1e-6) through 7 layers, and an order of magnitude below the
// smallest top-1/top-2 margin of the greedy references (~1e-3,
// min_margin_greedy), so exact greedy equality is a meaningful check.
//
// The trained default model (models/default; its references in
// tests/fixtures/golden/default, English prompts of up to 300 bytes) has
// logits up to |21.2| through 12 layers: 1e-4 is ~4.7e-6 of the largest; the
// differences measured 1.7e-5 (prompts) and 7.6e-6 (greedy), and its smallest
// greedy margin is 1.6e-2.
// A retrained model needs `tools/make_golden.py --only default`.
//
// Besides the contract's 1e-4, each fixture asserts the figure the README
// states as measured, as a bound with ~2x room (kMeasuredBound*): a change
// that moves our logits away from transformers fails here long before it
// reaches the contract. Measured (deterministic and fast modes, prompt and
// greedy rows): the tiny models up to 5.5e-6, the default model 1.7e-5.
//
// nemotron_h_tied_tiny says tie_word_embeddings=true but stores its own
// lm_head.weight, which transformers uses; logits from the embeddings would be
// up to 6.3 away (golden.json max_abs_diff_logits_with_embeddings_as_head).

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "engine/model.h"
#include "engine/model_test_util.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using testing::ArgMax;
using testing::GoldenCase;
using testing::MaxAbsDiff;

constexpr float kLogitTolerance = 1e-4f;
constexpr float kMeasuredBoundTiny = 1e-5f;
constexpr float kMeasuredBoundDefault = 4e-5f;
constexpr int kGreedyTokens = 12;

struct GoldenParam {
  absl::string_view name;  // of the test
  absl::string_view model_dir;
  kernels::MatmulMode mode;
  // golden.safetensors lives here; empty: in model_dir.
  absl::string_view golden_dir = {};
  float measured_bound = kMeasuredBoundTiny;
  testing::TestTarget target = testing::TestTarget::kCpu;
};

std::string ParamName(const ::testing::TestParamInfo<GoldenParam>& info) {
  return absl::StrCat(info.param.name,
                      info.param.mode == kernels::MatmulMode::kDeterministic ? "Deterministic" : "Fast",
                      testing::TestTargetName(info.param.target));
}

class ModelGoldenTest : public ::testing::TestWithParam<GoldenParam> {
 protected:
  void SetUp() override {
    weights_ = testing::LoadWeights(GetParam().model_dir);
    ASSERT_NE(weights_, nullptr);
    cases_ = testing::LoadGolden(GetParam().golden_dir.empty() ? GetParam().model_dir : GetParam().golden_dir);
    ASSERT_EQ(cases_.size(), 8u);
    bool skipped = false;
    backend_ = testing::MakeTargetBackend(GetParam().target, &skipped);
    if (skipped) return;
    ModelOptions options;
    options.backend = backend_.get();
    options.matmul_mode = GetParam().mode;
    options.max_pages = 64;
    model_ = testing::MakeModel(*weights_, options);
    ASSERT_NE(model_, nullptr);
    vocab_ = weights_->config().vocab_size;
  }

  std::unique_ptr<ModelWeights> weights_;
  std::vector<GoldenCase> cases_;
  std::unique_ptr<kernels::Backend> backend_;  // null on the CPU; outlives model_
  std::unique_ptr<Model> model_;
  int64_t vocab_ = 0;
};

TEST_P(ModelGoldenTest, PromptLogitsMatchTransformersWithinTolerance) {
  float worst = 0.0f;
  for (const GoldenCase& c : cases_) {
    auto id = model_->NewSequence();
    ASSERT_TRUE(id.ok()) << id.status();
    PrefillOptions all;
    all.all_logits = true;
    auto result = model_->Prefill(*id, c.prompt, all);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->logits.size(), c.logits.size());
    const float diff = MaxAbsDiff(result->logits, c.logits);
    EXPECT_LE(diff, kLogitTolerance) << "prompt of length " << c.prompt.size();
    worst = std::max(worst, diff);
    ASSERT_TRUE(model_->ReleaseSequence(*id).ok());
  }
  std::cout << "[golden] " << ParamName({GetParam(), 0}) << " prompt logits: max abs diff " << worst << "\n";
  EXPECT_LE(worst, GetParam().measured_bound) << "within the contract, but past the measured figure the README states";
}

TEST_P(ModelGoldenTest, GreedyContinuationEqualsTransformersCachedGenerate) {
  float worst = 0.0f;
  for (const GoldenCase& c : cases_) {
    auto id = model_->NewSequence();
    ASSERT_TRUE(id.ok()) << id.status();
    auto prefill = model_->Prefill(*id, c.prompt);
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    std::vector<float> row = prefill->logits;
    for (int step = 0; step < kGreedyTokens; ++step) {
      const absl::Span<const float> expected =
          absl::MakeConstSpan(c.greedy_logits).subspan(static_cast<size_t>(step * vocab_), static_cast<size_t>(vocab_));
      const float diff = MaxAbsDiff(row, expected);
      EXPECT_LE(diff, kLogitTolerance) << "prompt of length " << c.prompt.size() << ", step " << step;
      worst = std::max(worst, diff);
      const TokenId next = static_cast<TokenId>(ArgMax(row));
      ASSERT_EQ(next, c.greedy[static_cast<size_t>(step)])
          << "prompt of length " << c.prompt.size() << ", step " << step;
      if (step + 1 == kGreedyTokens) break;
      const SequenceId ids[] = {*id};
      const TokenId tokens[] = {next};
      auto decoded = model_->DecodeStep(ids, tokens);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      row = std::move(decoded).value();
    }
    ASSERT_TRUE(model_->ReleaseSequence(*id).ok());
  }
  std::cout << "[golden] " << ParamName({GetParam(), 0}) << " greedy (prefill + decode) logits: max abs diff " << worst
            << "\n";
  EXPECT_LE(worst, GetParam().measured_bound) << "within the contract, but past the measured figure the README states";
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ModelGoldenTest,
    ::testing::Values(GoldenParam{"NemotronHTiny", testing::kNemotronTiny, kernels::MatmulMode::kDeterministic},
                      GoldenParam{"NemotronHTiny", testing::kNemotronTiny, kernels::MatmulMode::kFast},
                      GoldenParam{"Mamba2Tiny", testing::kMamba2Tiny, kernels::MatmulMode::kDeterministic},
                      GoldenParam{"Mamba2Tiny", testing::kMamba2Tiny, kernels::MatmulMode::kFast},
                      GoldenParam{"NemotronHTiedTiny", testing::kNemotronTiedTiny, kernels::MatmulMode::kDeterministic},
                      GoldenParam{"NemotronHTiedTiny", testing::kNemotronTiedTiny, kernels::MatmulMode::kFast},
                      GoldenParam{"Default", testing::kDefaultModel, kernels::MatmulMode::kDeterministic,
                                  testing::kDefaultModelGolden, kMeasuredBoundDefault},
                      GoldenParam{"Default", testing::kDefaultModel, kernels::MatmulMode::kFast,
                                  testing::kDefaultModelGolden, kMeasuredBoundDefault},
                      // The CUDA backend, fp32 weights. Emulated: exact arithmetic in other
                      // reduction orders, so the tiny models' measured bound holds. On a GPU
                      // (FMA contraction, fast exp) only the contract's 1e-4 is claimed:
                      // no GPU figure has been measured yet.
                      GoldenParam{"NemotronHTiny", testing::kNemotronTiny, kernels::MatmulMode::kDeterministic, {},
                                  kMeasuredBoundTiny, testing::TestTarget::kCudaEmulated},
                      GoldenParam{"Mamba2Tiny", testing::kMamba2Tiny, kernels::MatmulMode::kDeterministic, {},
                                  kMeasuredBoundTiny, testing::TestTarget::kCudaEmulated},
                      GoldenParam{"NemotronHTiny", testing::kNemotronTiny, kernels::MatmulMode::kDeterministic, {},
                                  kLogitTolerance, testing::TestTarget::kCudaGpu},
                      GoldenParam{"NemotronHTiny", testing::kNemotronTiny, kernels::MatmulMode::kFast, {},
                                  kLogitTolerance, testing::TestTarget::kCudaGpu},
                      GoldenParam{"Mamba2Tiny", testing::kMamba2Tiny, kernels::MatmulMode::kDeterministic, {},
                                  kLogitTolerance, testing::TestTarget::kCudaGpu},
                      GoldenParam{"Default", testing::kDefaultModel, kernels::MatmulMode::kDeterministic,
                                  testing::kDefaultModelGolden, kLogitTolerance, testing::TestTarget::kCudaGpu}),
    ParamName);

}  // namespace
}  // namespace hybridserve::engine
