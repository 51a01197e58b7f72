#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::engine {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

Sampler MakeSampler(const SamplingParams& params) {
  absl::StatusOr<Sampler> sampler = Sampler::Create(params);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return *std::move(sampler);
}

int32_t SampleOrDie(Sampler& sampler, absl::Span<const float> logits, int64_t step) {
  absl::StatusOr<SampledToken> token = sampler.Sample(logits, step);
  EXPECT_TRUE(token.ok()) << token.status();
  return token.ok() ? token->token : -1;
}

std::vector<float> RandomLogits(std::mt19937_64& rng, int vocab, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(rng);
  return logits;
}

// Probabilities proportional to exp(logit / temperature), in double.
std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - max) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

// Draws `draws` tokens (seed fixed, steps 0..draws-1) and returns frequencies.
std::vector<double> FrequenciesOverSteps(const SamplingParams& params, const std::vector<float>& logits, int draws) {
  Sampler sampler = MakeSampler(params);
  std::vector<double> freq(logits.size(), 0.0);
  for (int step = 0; step < draws; ++step) freq[SampleOrDie(sampler, logits, step)] += 1.0 / draws;
  return freq;
}

// Draws step 0 of `draws` requests seeded from distinct request ids: how the
// first token of many requests is distributed.
std::vector<double> FrequenciesOverSeeds(SamplingParams params, const std::vector<float>& logits, int draws) {
  std::vector<double> freq(logits.size(), 0.0);
  for (int r = 0; r < draws; ++r) {
    params.seed = SeedFromRequestId(absl::StrCat("request-", r));
    Sampler sampler = MakeSampler(params);
    freq[SampleOrDie(sampler, logits, 0)] += 1.0 / draws;
  }
  return freq;
}

// 100000 draws: the standard error of a frequency is at most
// sqrt(0.25 / 100000) = 0.0016, so 0.01 is more than six standard errors; the
// draws are seeded, so the outcome is fixed, and a biased sampler (e.g. one
// ignoring temperature, which moves these bins by > 0.05) fails.
constexpr int kDraws = 100000;
constexpr double kFrequencyTolerance = 0.01;

void ExpectFrequenciesNear(const std::vector<double>& freq, const std::vector<double>& expected) {
  ASSERT_EQ(freq.size(), expected.size());
  for (size_t i = 0; i < freq.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(freq[i], 0.0) << "token " << i << " must never be sampled";
    } else {
      EXPECT_NEAR(freq[i], expected[i], kFrequencyTolerance) << "token " << i;
    }
  }
}

// A direct implementation of the algorithm documented in sampler.h: a full
// sort by rank, the top-k cut, the nucleus cut with better-ranked sums in plain
// rank order, and the draw over the kept tokens in id order. The sampler sums
// the better-ranked weights of a nucleus over the whole row bin by bin instead,
// which can only move a boundary whose sum lies within rounding (~1e-16
// relative) of top_p times the total; the seeded rows below have none.
int32_t ReferenceSample(const std::vector<float>& logits, const SamplingParams& params, int64_t step) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<int32_t> ranked(vocab);
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (params.temperature == 0.0f || params.top_k == 1) return ranked[0];
  const double max = logits[ranked[0]];
  auto weight = [&](int32_t id) {
    return std::exp((static_cast<double>(logits[id]) - max) * (1.0 / params.temperature));
  };
  if (params.top_k > 0 && params.top_k < vocab) ranked.resize(params.top_k);
  if (params.top_p < 1.0f) {
    std::vector<int32_t> by_id = ranked;
    std::sort(by_id.begin(), by_id.end());
    double total = 0.0;
    for (int32_t id : by_id) total += weight(id);
    double before = 0.0;
    size_t keep = 0;
    while (keep < ranked.size() && before < params.top_p * total) before += weight(ranked[keep++]);
    ranked.resize(keep);
  }
  std::vector<int32_t> kept = ranked;
  std::sort(kept.begin(), kept.end());
  double total = 0.0;
  for (int32_t id : kept) total += weight(id);
  const double target = SamplingUniform(params.seed, step) * total;
  double cumulative = 0.0;
  int32_t last = kept[0];
  for (int32_t id : kept) {
    const double w = weight(id);
    if (w <= 0.0) continue;
    cumulative += w;
    last = id;
    if (cumulative > target) return id;
  }
  return last;
}

TEST(SamplerTest, GreedyPicksTheArgmax) {
  Sampler sampler = MakeSampler(SamplingParams{.temperature = 0.0f});
  const std::vector<float> logits = {0.5f, -1.0f, 3.25f, 3.0f, -kInf};
  for (int64_t step = 0; step < 10; ++step) EXPECT_EQ(SampleOrDie(sampler, logits, step), 2);
}

TEST(SamplerTest, GreedyTieGoesToTheLowestTokenId) {
  Sampler sampler = MakeSampler(SamplingParams{.temperature = 0.0f});
  EXPECT_EQ(SampleOrDie(sampler, std::vector<float>{1.0f, 7.0f, 2.0f, 7.0f, 7.0f}, 0), 1);
  EXPECT_EQ(SampleOrDie(sampler, std::vector<float>{-kInf, -kInf, -3.0f, -3.0f}, 0), 2);
}

TEST(SamplerTest, TopKOneEqualsGreedyForAnySeedAndTemperature) {
  std::mt19937_64 rng(7);
  Sampler greedy = MakeSampler(SamplingParams{.temperature = 0.0f});
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits = RandomLogits(rng, 50, 2.0f);
    logits[trial % 50] = logits[(trial + 1) % 50];  // plant a tie
    Sampler top1 = MakeSampler(SamplingParams{.temperature = 1.5f, .top_k = 1, .top_p = 0.5f, .seed = rng()});
    EXPECT_EQ(SampleOrDie(top1, logits, trial), SampleOrDie(greedy, logits, trial)) << "trial " << trial;
  }
}

TEST(SamplerTest, SamplingUniformMatchesIndependentlyComputedValues) {
  // Computed with a separate Python implementation of the formula in sampler.h;
  // each is an integer k with u = k * 2^-53.
  EXPECT_EQ(SamplingUniform(0, 0), 7956156453446585.0 * 0x1.0p-53);
  EXPECT_EQ(SamplingUniform(42, 0), 5369361458086087.0 * 0x1.0p-53);
  EXPECT_EQ(SamplingUniform(42, 1), 1444442999664155.0 * 0x1.0p-53);
  EXPECT_EQ(SamplingUniform(42, 1000000), 8822319293931160.0 * 0x1.0p-53);
  EXPECT_EQ(SamplingUniform(0xFFFFFFFFFFFFFFFFULL, 7), 6972874209677968.0 * 0x1.0p-53);
}

// Known answers: XXH3-64 with seed 0 of the id's bytes, computed apart from
// this code with the Python package xxhash 4.1.0 (bundling xxHash 0.8.4):
//   xxhash.xxh3_64_intdigest(request_id.encode(), seed=0)
// One id per length class of XXH3's code paths: 0, 1-3, 4-8, 9-16, 17-128,
// 129-240 bytes, and past 240 (several 1 KiB blocks).
TEST(SamplerTest, SeedFromRequestIdIsXxh3OfTheId) {
  EXPECT_EQ(SeedFromRequestId(""), 0x2D06800538D394C2ULL);
  EXPECT_EQ(SeedFromRequestId("a"), 0xE6C632B61E964E1FULL);
  EXPECT_EQ(SeedFromRequestId("req-1"), 0xB37C3BEEB68532D6ULL);
  EXPECT_EQ(SeedFromRequestId("req-2"), 0x9BADD4596E9B6051ULL);
  EXPECT_EQ(SeedFromRequestId("request-0"), 0x5BF0488AF13060F1ULL);
  EXPECT_EQ(SeedFromRequestId("cmpl-0123456789abcdef0123456789abcdef"), 0xD2D08E78A2A6AEBDULL);
  EXPECT_EQ(SeedFromRequestId(std::string(200, 'x')), 0x50EF124FB1E4DE53ULL);
  EXPECT_EQ(SeedFromRequestId(std::string(2500, 'x')), 0xB0C00940E1E5F19DULL);
}

TEST(SamplerTest, TokensDependOnlyOnSeedStepAndRowNotOnTheRestOfTheBatch) {
  constexpr int kVocab = 64;
  constexpr int kSteps = 40;
  const SamplingParams params{.temperature = 0.9f, .top_k = 20, .top_p = 0.95f, .seed = 1234};
  std::mt19937_64 rng(11);
  std::vector<std::vector<float>> rows;
  for (int step = 0; step < kSteps; ++step) rows.push_back(RandomLogits(rng, kVocab, 1.5f));

  // Alone.
  Sampler alone = MakeSampler(params);
  std::vector<int32_t> expected;
  for (int step = 0; step < kSteps; ++step) expected.push_back(SampleOrDie(alone, rows[step], step));

  // In a batch whose size changes every step, with other requests (other seeds,
  // other parameters) sampled before and after it on the same Sampler instance
  // and on their own.
  Sampler shared = MakeSampler(params);
  std::vector<Sampler> others;
  for (int r = 0; r < 5; ++r) {
    others.push_back(MakeSampler(SamplingParams{.temperature = 0.5f + r, .top_p = 0.8f, .seed = rng()}));
  }
  for (int step = 0; step < kSteps; ++step) {
    const int batch = 1 + step % 5;
    for (int r = 0; r < batch; ++r) SampleOrDie(others[r], RandomLogits(rng, kVocab * (r + 1), 3.0f), step + r);
    SampleOrDie(shared, RandomLogits(rng, 3 * kVocab, 1.0f), step * 7);
    EXPECT_EQ(SampleOrDie(shared, rows[step], step), expected[step]) << "step " << step;
  }
  // Replayed in reverse, as a retried or resumed request would.
  Sampler replay = MakeSampler(params);
  for (int step = kSteps - 1; step >= 0; --step) EXPECT_EQ(SampleOrDie(replay, rows[step], step), expected[step]);
}

TEST(SamplerTest, MatchesTheReferenceAlgorithmExactlyOnRandomRows) {
  std::mt19937_64 rng(99);
  const float temperatures[] = {0.0f, 0.25f, 1.0f, 2.0f};
  const int32_t top_ks[] = {0, 1, 3, 40, 5000};
  const float top_ps[] = {1.0f, 0.9f, 0.3f, 1e-6f};
  int trial = 0;
  for (float temperature : temperatures) {
    for (int32_t top_k : top_ks) {
      for (float top_p : top_ps) {
        // 3000 tokens: more than the 256 the nucleus search orders at first.
        std::vector<float> logits = RandomLogits(rng, 3000, trial % 2 ? 0.2f : 4.0f);
        for (int i = 0; i < 300; ++i) logits[rng() % logits.size()] = -kInf;
        logits[rng() % logits.size()] = logits[rng() % logits.size()];
        const SamplingParams params{.temperature = temperature, .top_k = top_k, .top_p = top_p, .seed = rng()};
        Sampler sampler = MakeSampler(params);
        for (int64_t step = 0; step < 20; ++step) {
          ASSERT_EQ(SampleOrDie(sampler, logits, step), ReferenceSample(logits, params, step))
              << "T=" << temperature << " top_k=" << top_k << " top_p=" << top_p << " step=" << step;
        }
        ++trial;
      }
    }
  }
}

TEST(SamplerTest, TemperatureSamplesTheTemperedSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f, -kInf};
  const SamplingParams params{.temperature = 0.7f, .seed = 5};
  const std::vector<double> expected = Softmax(logits, 0.7);
  ExpectFrequenciesNear(FrequenciesOverSteps(params, logits, kDraws), expected);
  ExpectFrequenciesNear(FrequenciesOverSeeds(params, logits, kDraws), expected);
}

TEST(SamplerTest, TopKSamplesOnlyTheKMostLikelyRenormalized) {
  // Sorted by likelihood: 2, 0, 4, 1, 3; ties between 1 and 3 never matter at k = 3.
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, 0.0f, 0.5f};
  const SamplingParams params{.temperature = 1.0f, .top_k = 3, .seed = 17};
  std::vector<double> expected = Softmax({1.0f, -kInf, 2.0f, -kInf, 0.5f}, 1.0);
  ExpectFrequenciesNear(FrequenciesOverSteps(params, logits, kDraws), expected);
  ExpectFrequenciesNear(FrequenciesOverSeeds(params, logits, kDraws), expected);
}

TEST(SamplerTest, TopPKeepsTheTokenThatCrossesPAndNothingBeyond) {
  // Probabilities 0.4, 0.3, 0.2, 0.1 (token 3 is the most likely).
  const std::vector<float> logits = {std::log(0.3f), std::log(0.1f), std::log(0.2f), std::log(0.4f)};
  // Cumulative before each token in order 3, 0, 2, 1: 0, 0.4, 0.7, 0.9. With
  // p = 0.75 token 2 crosses and is kept; token 1 is never drawn.
  const SamplingParams params{.temperature = 1.0f, .top_p = 0.75f, .seed = 23};
  const std::vector<double> expected = {0.3 / 0.9, 0.0, 0.2 / 0.9, 0.4 / 0.9};
  ExpectFrequenciesNear(FrequenciesOverSteps(params, logits, kDraws), expected);
  ExpectFrequenciesNear(FrequenciesOverSeeds(params, logits, kDraws), expected);
  // p below the first token's mass keeps only that token.
  Sampler tiny = MakeSampler(SamplingParams{.temperature = 1.0f, .top_p = 0.35f, .seed = 1});
  for (int64_t step = 0; step < 1000; ++step) ASSERT_EQ(SampleOrDie(tiny, logits, step), 3);
}

TEST(SamplerTest, TopKThenTopPAppliesTheNucleusToTheRenormalizedTopK) {
  // Top-2 of {0.4, 0.3, 0.2, 0.1} renormalizes to 4/7, 3/7; p = 0.5 keeps only
  // the first (4/7 >= 0.5), whereas over the full row it would keep two.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.1f), std::log(0.2f), std::log(0.4f)};
  Sampler sampler = MakeSampler(SamplingParams{.temperature = 1.0f, .top_k = 2, .top_p = 0.5f, .seed = 3});
  for (int64_t step = 0; step < 1000; ++step) ASSERT_EQ(SampleOrDie(sampler, logits, step), 3);
}

TEST(SamplerTest, MaskedTokensAreNeverSampled) {
  std::vector<float> logits(100, -kInf);
  logits[17] = 0.0f;
  logits[83] = 0.0f;
  Sampler sampler = MakeSampler(SamplingParams{.temperature = 5.0f, .seed = 8});
  for (int64_t step = 0; step < 5000; ++step) {
    const int32_t token = SampleOrDie(sampler, logits, step);
    ASSERT_TRUE(token == 17 || token == 83) << token;
  }
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmaxAndSumToOne) {
  std::mt19937_64 rng(3);
  const std::vector<float> logits = RandomLogits(rng, kMaxTopLogprobs, 3.0f);
  // Temperature and filters do not change the reported (raw) logprobs.
  Sampler sampler = MakeSampler(SamplingParams{
      .temperature = 0.3f, .top_k = 4, .top_p = 0.9f, .seed = 1, .logprobs = true, .top_logprobs = kMaxTopLogprobs});
  absl::StatusOr<SampledToken> sampled = sampler.Sample(logits, 0);
  ASSERT_TRUE(sampled.ok()) << sampled.status();
  ASSERT_EQ(sampled->top_logprobs.size(), logits.size());
  const std::vector<double> p = Softmax(logits, 1.0);
  double sum = 0.0;
  for (size_t j = 0; j < sampled->top_logprobs.size(); ++j) {
    const TokenLogprob& entry = sampled->top_logprobs[j];
    sum += std::exp(static_cast<double>(entry.logprob));
    EXPECT_NEAR(entry.logprob, std::log(p[entry.token]), 1e-5);
    if (j > 0) EXPECT_LE(entry.logprob, sampled->top_logprobs[j - 1].logprob) << "not descending at " << j;
    if (entry.token == sampled->token) EXPECT_EQ(entry.logprob, sampled->logprob);
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

TEST(SamplerTest, TopLogprobsBreakTiesByLowerTokenIdAndIncludeMaskedLast) {
  const std::vector<float> logits = {0.0f, 2.0f, -kInf, 2.0f, 1.0f};
  Sampler sampler = MakeSampler(SamplingParams{.temperature = 0.0f, .logprobs = true, .top_logprobs = 5});
  absl::StatusOr<SampledToken> sampled = sampler.Sample(logits, 0);
  ASSERT_TRUE(sampled.ok()) << sampled.status();
  std::vector<int32_t> ids;
  for (const TokenLogprob& t : sampled->top_logprobs) ids.push_back(t.token);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4, 0, 2}));
  EXPECT_EQ(sampled->top_logprobs.back().logprob, -kInf);
  EXPECT_EQ(sampled->token, 1);
  // logsumexp = 2 + log(1 + 1 + e^-1 + e^-2)
  const double lse = 2.0 + std::log(2.0 + std::exp(-1.0) + std::exp(-2.0));
  EXPECT_FLOAT_EQ(sampled->logprob, static_cast<float>(2.0 - lse));
}

TEST(SamplerTest, LogprobsAreOmittedUnlessRequested) {
  Sampler sampler = MakeSampler(SamplingParams{.temperature = 1.0f, .seed = 2});
  absl::StatusOr<SampledToken> sampled = sampler.Sample(std::vector<float>{1.0f, 2.0f}, 0);
  ASSERT_TRUE(sampled.ok());
  EXPECT_EQ(sampled->logprob, 0.0f);
  EXPECT_TRUE(sampled->top_logprobs.empty());
}

TEST(SamplerTest, InvalidParamsAreRejectedNamingTheField) {
  struct Case {
    SamplingParams params;
    const char* field;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Case cases[] = {
      {{.temperature = -0.1f}, "temperature"},
      {{.temperature = nan}, "temperature"},
      {{.temperature = kInf}, "temperature"},
      {{.top_k = -1}, "top_k"},
      {{.top_p = 0.0f}, "top_p"},
      {{.top_p = 1.01f}, "top_p"},
      {{.top_p = nan}, "top_p"},
      {{.logprobs = true, .top_logprobs = -1}, "top_logprobs"},
      {{.logprobs = true, .top_logprobs = kMaxTopLogprobs + 1}, "top_logprobs"},
      {{.logprobs = false, .top_logprobs = 3}, "top_logprobs"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Sampler> sampler = Sampler::Create(c.params);
    ASSERT_FALSE(sampler.ok()) << c.field;
    EXPECT_EQ(sampler.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(sampler.status().message()), HasSubstr(c.field));
  }
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{.temperature = 0.0f, .top_k = 0, .top_p = 1.0f}).ok());
}

TEST(SamplerTest, BadLogitRowsAreErrorsNotCrashes) {
  Sampler sampler = MakeSampler(SamplingParams{.temperature = 1.0f, .logprobs = true});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, nan, 2.0f}, 0).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, kInf}, 0).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(sampler.Sample(std::vector<float>{-kInf, -kInf}, 0).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(sampler.Sample(std::vector<float>{}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f}, -1).status().code(), absl::StatusCode::kInvalidArgument);
  Sampler greedy = MakeSampler(SamplingParams{.temperature = 0.0f});
  EXPECT_EQ(greedy.Sample(std::vector<float>{nan}, 0).status().code(), absl::StatusCode::kInternal);
}

TEST(SamplerTest, ExtremeTemperaturesStayFinite) {
  const std::vector<float> logits = {3.0e38f, -3.0e38f, 3.0e38f, 0.0f};
  Sampler cold = MakeSampler(SamplingParams{.temperature = 1e-38f, .seed = 4});
  Sampler hot = MakeSampler(SamplingParams{.temperature = 3e38f, .seed = 4});
  for (int64_t step = 0; step < 200; ++step) {
    const int32_t c = SampleOrDie(cold, logits, step);
    ASSERT_TRUE(c == 0 || c == 2) << c;  // only the tied maxima have weight
    const int32_t h = SampleOrDie(hot, logits, step);
    ASSERT_TRUE(h >= 0 && h < 4) << h;
  }
}

}  // namespace
}  // namespace hybridserve::engine
