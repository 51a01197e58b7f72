// The engine against Hugging Face transformers 5.23 (fp32, CPU) on the golden
// fixtures (docs/ARCHITECTURE.md section 6, contract 5; tools/README.md).
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
// Bamba, Granite and Nemotron-H MoE tiny fixtures: measured up to 1.07e-5
// (BambaTiny2 on the emulated CUDA backend), 7.5e-6 on the CPU; the Nemotron-H
// MoE ones up to 4.6e-6 on the CPU and 3.4e-6 emulated.
constexpr float kMeasuredBoundFamilies = 2e-5f;
// zamba2_tiny2 (its branch outputs initialised at 0.4 times the usual scale,
// so that its layers amplify fp32 rounding less): measured up to 1.6e-5
// (prompts, the CPU's fast mode) and 5.7e-6 (greedy steps).
constexpr float kMeasuredBoundZambaTiny2 = 3e-5f;
// The Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): measured up to 9.2e-5
// (qwen3_5_moe_tiny, one row of the 128-token prompt; the other rows within
// 4e-5), 5.6e-5 on qwen3_next_tiny. The reference is that noisy itself:
// transformers' fp32 logits of that row differ from its own fp64 run by 5.7e-5,
// and its chunked prefill from its recurrent decode by up to 3.8e-5 (golden.json
// max_abs_diff_cached_vs_uncached_logits). So the bound is the contract's.
constexpr float kMeasuredBoundGatedDeltaNet = 1e-4f;
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
    // 8 prompts for the chunk-16 fixtures, 7 across the Gated DeltaNet's 64-token grid.
    ASSERT_GE(cases_.size(), 7u);
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
    auto id = model_->sequences().New();
    ASSERT_TRUE(id.ok()) << id.status();
    PrefillOptions all;
    all.all_logits = true;
    auto result = model_->Prefill(*id, c.prompt, all);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->logits.size(), c.logits.size());
    const float diff = MaxAbsDiff(result->logits, c.logits);
    EXPECT_LE(diff, kLogitTolerance) << "prompt of length " << c.prompt.size();
    worst = std::max(worst, diff);
    ASSERT_TRUE(model_->sequences().Release(*id).ok());
  }
  std::cout << "[golden] " << ParamName({GetParam(), 0}) << " prompt logits: max abs diff " << worst << "\n";
  EXPECT_LE(worst, GetParam().measured_bound) << "within the contract, but past the measured figure the README states";
}

TEST_P(ModelGoldenTest, GreedyContinuationEqualsTransformersCachedGenerate) {
  float worst = 0.0f;
  for (const GoldenCase& c : cases_) {
    auto id = model_->sequences().New();
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
    ASSERT_TRUE(model_->sequences().Release(*id).ok());
  }
  std::cout << "[golden] " << ParamName({GetParam(), 0}) << " greedy (prefill + decode) logits: max abs diff " << worst
            << "\n";
  EXPECT_LE(worst, GetParam().measured_bound) << "within the contract, but past the measured figure the README states";
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ModelGoldenTest,
    ::testing::Values(
        GoldenParam{"Qwen3NextTiny",
                    testing::kQwen3NextTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundGatedDeltaNet},
        GoldenParam{
            "Qwen3NextTiny", testing::kQwen3NextTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundGatedDeltaNet},
        GoldenParam{"Qwen3NextSparseTiny",
                    testing::kQwen3NextSparseTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundGatedDeltaNet},
        GoldenParam{
            "Qwen35Tiny", testing::kQwen35Tiny, kernels::MatmulMode::kDeterministic, {}, kMeasuredBoundGatedDeltaNet},
        GoldenParam{"Qwen35Tiny", testing::kQwen35Tiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundGatedDeltaNet},
        GoldenParam{"Qwen35MoeTiny",
                    testing::kQwen35MoeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundGatedDeltaNet},
        GoldenParam{
            "Qwen35MoeTiny", testing::kQwen35MoeTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundGatedDeltaNet},
        GoldenParam{"Qwen35MoeTiny",
                    testing::kQwen35MoeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundGatedDeltaNet,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"Qwen3NextTiny",
                    testing::kQwen3NextTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundGatedDeltaNet,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"Qwen3NextTiny",
                    testing::kQwen3NextTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundGatedDeltaNet,
                    testing::TestTarget::kCudaGpu},
        GoldenParam{"Qwen35MoeTiny",
                    testing::kQwen35MoeTiny,
                    kernels::MatmulMode::kFast,
                    {},
                    kMeasuredBoundGatedDeltaNet,
                    testing::TestTarget::kCudaGpu},
        GoldenParam{"NemotronHTiny", testing::kNemotronTiny, kernels::MatmulMode::kDeterministic},
        GoldenParam{"NemotronHTiny", testing::kNemotronTiny, kernels::MatmulMode::kFast},
        GoldenParam{"Mamba2Tiny", testing::kMamba2Tiny, kernels::MatmulMode::kDeterministic},
        GoldenParam{"Mamba2Tiny", testing::kMamba2Tiny, kernels::MatmulMode::kFast},
        GoldenParam{"NemotronHTiedTiny", testing::kNemotronTiedTiny, kernels::MatmulMode::kDeterministic},
        GoldenParam{"NemotronHTiedTiny", testing::kNemotronTiedTiny, kernels::MatmulMode::kFast},
        GoldenParam{"Default", testing::kDefaultModel, kernels::MatmulMode::kDeterministic,
                    testing::kDefaultModelGolden, kMeasuredBoundDefault},
        GoldenParam{"Default", testing::kDefaultModel, kernels::MatmulMode::kFast, testing::kDefaultModelGolden,
                    kMeasuredBoundDefault},
        GoldenParam{"BambaTiny", testing::kBambaTiny, kernels::MatmulMode::kDeterministic, {}, kMeasuredBoundFamilies},
        GoldenParam{"BambaTiny", testing::kBambaTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{
            "BambaTiny2", testing::kBambaTiny2, kernels::MatmulMode::kDeterministic, {}, kMeasuredBoundFamilies},
        GoldenParam{"BambaTiny2", testing::kBambaTiny2, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{
            "PublicBamba9b", testing::kPublicBamba9b, kernels::MatmulMode::kDeterministic, {}, kMeasuredBoundFamilies},
        GoldenParam{"PublicBamba9b", testing::kPublicBamba9b, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"GraniteMoeTiny",
                    testing::kGraniteMoeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{"GraniteMoeTiny", testing::kGraniteMoeTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"GraniteDenseTiny",
                    testing::kGraniteDenseTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{
            "GraniteDenseTiny", testing::kGraniteDenseTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{
            "FalconH1Tiny", testing::kFalconTiny, kernels::MatmulMode::kDeterministic, {}, kMeasuredBoundFamilies},
        GoldenParam{"FalconH1Tiny", testing::kFalconTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{
            "FalconH1Tiny2", testing::kFalconTiny2, kernels::MatmulMode::kDeterministic, {}, kMeasuredBoundFamilies},
        GoldenParam{"FalconH1Tiny2", testing::kFalconTiny2, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{
            "FalconH1Tiny3", testing::kFalconTiny3, kernels::MatmulMode::kDeterministic, {}, kMeasuredBoundFamilies},
        GoldenParam{"FalconH1Tiny3", testing::kFalconTiny3, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"GraniteNopeTiny",
                    testing::kGraniteNopeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{
            "GraniteNopeTiny", testing::kGraniteNopeTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"GraniteAttnBiasTiny",
                    testing::kGraniteAttnBiasTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{"GraniteAttnBiasTiny",
                    testing::kGraniteAttnBiasTiny,
                    kernels::MatmulMode::kFast,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{"FalconH1OutBiasTiny",
                    testing::kFalconOutBiasTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{
            "FalconH1OutBiasTiny", testing::kFalconOutBiasTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"FalconH1InBiasTiny",
                    testing::kFalconInBiasTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{
            "FalconH1InBiasTiny", testing::kFalconInBiasTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"Zamba2Tiny", testing::kZambaTiny, kernels::MatmulMode::kDeterministic, {}, kMeasuredBoundFamilies},
        GoldenParam{"Zamba2Tiny", testing::kZambaTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{
            "Zamba2Tiny2", testing::kZambaTiny2, kernels::MatmulMode::kDeterministic, {}, kMeasuredBoundZambaTiny2},
        GoldenParam{"Zamba2Tiny2", testing::kZambaTiny2, kernels::MatmulMode::kFast, {}, kMeasuredBoundZambaTiny2},
        GoldenParam{"Zamba2PerUseTiny",
                    testing::kZambaPerUseTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{
            "Zamba2PerUseTiny", testing::kZambaPerUseTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"Zamba2UntiedTiny",
                    testing::kZambaUntiedTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{
            "Zamba2UntiedTiny", testing::kZambaUntiedTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"NemotronMoeTiny",
                    testing::kNemotronMoeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{
            "NemotronMoeTiny", testing::kNemotronMoeTiny, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"NemotronMoeTiny2",
                    testing::kNemotronMoeTiny2,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{
            "NemotronMoeTiny2", testing::kNemotronMoeTiny2, kernels::MatmulMode::kFast, {}, kMeasuredBoundFamilies},
        GoldenParam{"NemotronMoeBiasTiny",
                    testing::kNemotronMoeBiasTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{"NemotronMoeBiasTiny",
                    testing::kNemotronMoeBiasTiny,
                    kernels::MatmulMode::kFast,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{"NemotronLatentMoeTiny",
                    testing::kNemotronLatentMoeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies},
        GoldenParam{"NemotronLatentMoeTiny",
                    testing::kNemotronLatentMoeTiny,
                    kernels::MatmulMode::kFast,
                    {},
                    kMeasuredBoundFamilies},
        // The CUDA backend, fp32 weights. Emulated: exact arithmetic in other
        // reduction orders, so the tiny models' measured bound holds. On a GPU
        // (FMA contraction, fast exp) only the contract's 1e-4 is claimed:
        // no GPU figure has been measured yet.
        GoldenParam{"NemotronMoeBiasTiny",
                    testing::kNemotronMoeBiasTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"NemotronHTiny",
                    testing::kNemotronTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundTiny,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"Mamba2Tiny",
                    testing::kMamba2Tiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundTiny,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"BambaTiny2",
                    testing::kBambaTiny2,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"PublicBamba9b",
                    testing::kPublicBamba9b,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"GraniteMoeTiny",
                    testing::kGraniteMoeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"GraniteDenseTiny",
                    testing::kGraniteDenseTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"FalconH1Tiny2",
                    testing::kFalconTiny2,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"Zamba2Tiny2",
                    testing::kZambaTiny2,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundZambaTiny2,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"Zamba2PerUseTiny",
                    testing::kZambaPerUseTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"GraniteNopeTiny",
                    testing::kGraniteNopeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"GraniteAttnBiasTiny",
                    testing::kGraniteAttnBiasTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"FalconH1OutBiasTiny",
                    testing::kFalconOutBiasTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"FalconH1InBiasTiny",
                    testing::kFalconInBiasTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"Zamba2UntiedTiny",
                    testing::kZambaUntiedTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"NemotronMoeTiny",
                    testing::kNemotronMoeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"NemotronLatentMoeTiny",
                    testing::kNemotronLatentMoeTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kMeasuredBoundFamilies,
                    testing::TestTarget::kCudaEmulated},
        GoldenParam{"NemotronHTiny",
                    testing::kNemotronTiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kLogitTolerance,
                    testing::TestTarget::kCudaGpu},
        GoldenParam{"NemotronHTiny",
                    testing::kNemotronTiny,
                    kernels::MatmulMode::kFast,
                    {},
                    kLogitTolerance,
                    testing::TestTarget::kCudaGpu},
        GoldenParam{"Mamba2Tiny",
                    testing::kMamba2Tiny,
                    kernels::MatmulMode::kDeterministic,
                    {},
                    kLogitTolerance,
                    testing::TestTarget::kCudaGpu},
        GoldenParam{"Default", testing::kDefaultModel, kernels::MatmulMode::kDeterministic,
                    testing::kDefaultModelGolden, kLogitTolerance, testing::TestTarget::kCudaGpu}),
    ParamName);

// bf16 weights on the CUDA backend. The deterministic matmul reads bf16
// weights and widens them exactly, so a checkpoint stored in bf16 gives the
// bits of the same values stored in fp32, prefill and decode; and the CUDA
// model stays within the golden tolerance of the CPU model on those values.
// (transformers' references are for the fp32 fixtures, whose values differ.)
class CudaBf16Test : public ::testing::TestWithParam<testing::TestTarget> {};

TEST_P(CudaBf16Test, Bf16WeightsGiveTheBitsOfTheirValuesInFp32AndStayCloseToTheCpu) {
  for (absl::string_view dir : {testing::kNemotronTiny, testing::kMamba2Tiny}) {
    SCOPED_TRACE(dir);
    std::unique_ptr<ModelWeights> bf16 = testing::LoadWeightsCutToBf16(dir, /*as_bf16=*/true);
    std::unique_ptr<ModelWeights> f32 = testing::LoadWeightsCutToBf16(dir, /*as_bf16=*/false);
    ASSERT_TRUE(bf16 != nullptr && f32 != nullptr);
    ASSERT_TRUE(bf16->has_bf16_matrices());
    ASSERT_FALSE(f32->has_bf16_matrices());
    bool skipped = false;
    std::unique_ptr<kernels::Backend> device = testing::MakeTargetBackend(GetParam(), &skipped);
    if (skipped) return;
    ModelOptions options;
    options.max_pages = 64;
    options.backend = device.get();
    auto on_bf16 = testing::MakeModel(*bf16, options);
    auto on_f32 = testing::MakeModel(*f32, options);
    options.backend = nullptr;  // the CPU
    auto on_cpu = testing::MakeModel(*f32, options);
    ASSERT_TRUE(on_bf16 != nullptr && on_f32 != nullptr && on_cpu != nullptr);
    const int64_t vocab = bf16->config().vocab_size;
    const std::vector<TokenId> prompt = testing::RandomTokens(7, 41, vocab);
    std::vector<std::vector<float>> rows[3];
    Model* models[3] = {on_bf16.get(), on_f32.get(), on_cpu.get()};
    for (int m = 0; m < 3; ++m) {
      auto id = models[m]->sequences().New();
      ASSERT_TRUE(id.ok());
      auto prefill = models[m]->Prefill(*id, prompt);
      ASSERT_TRUE(prefill.ok()) << prefill.status();
      rows[m].push_back(prefill->logits);
      TokenId next = static_cast<TokenId>(ArgMax(prefill->logits));
      for (int step = 0; step < 6; ++step) {
        const SequenceId ids[] = {*id};
        const TokenId tokens[] = {next};
        auto logits = models[m]->DecodeStep(ids, tokens);
        ASSERT_TRUE(logits.ok()) << logits.status();
        rows[m].push_back(*logits);
        next = static_cast<TokenId>(ArgMax(*logits));
      }
    }
    float worst = 0.0f;
    for (size_t r = 0; r < rows[0].size(); ++r) {
      EXPECT_TRUE(testing::BitEqual(rows[0][r], rows[1][r])) << "row " << r;
      EXPECT_EQ(ArgMax(rows[1][r]), ArgMax(rows[2][r])) << "row " << r;
      worst = std::max(worst, MaxAbsDiff(rows[1][r], rows[2][r]));
    }
    EXPECT_LE(worst, kLogitTolerance);
    std::cout << "[bf16] " << dir << " " << testing::TestTargetName(GetParam())
              << ": bf16 = fp32 bits; vs the CPU max abs diff " << worst << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaBf16Test,
                         ::testing::Values(testing::TestTarget::kCudaEmulated, testing::TestTarget::kCudaGpu),
                         [](const ::testing::TestParamInfo<testing::TestTarget>& info) {
                           return testing::TestTargetName(info.param);
                         });

}  // namespace
}  // namespace hybridserve::engine
