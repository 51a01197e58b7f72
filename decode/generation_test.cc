#include "decode/generation.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace hybridserve::decode {
namespace {

std::optional<FinishReason> Stop(const StopConditions& stop, const std::vector<TokenId>& eos,
                                 const std::vector<TokenId>& generated, TokenId* stop_token) {
  return StopReason(stop, eos, generated, stop_token);
}

TEST(StopReasonTest, EachConditionEndsTheRequestWithItsReasonAndToken) {
  StopConditions stop;
  stop.max_tokens = 5;
  stop.stop_token_ids = {7};
  stop.stop_sequences = {{3, 4}};
  TokenId token = -1;
  EXPECT_EQ(Stop(stop, {2}, {1}, &token), std::nullopt);
  EXPECT_EQ(Stop(stop, {2}, {1, 2}, &token), FinishReason::kStop);
  EXPECT_EQ(token, 2) << "EOS names the token";
  token = -1;
  EXPECT_EQ(Stop(stop, {2}, {1, 7}, &token), FinishReason::kStop);
  EXPECT_EQ(token, 7) << "a stop id names the token";
  token = -1;
  EXPECT_EQ(Stop(stop, {2}, {1, 3, 4}, &token), FinishReason::kStop);
  EXPECT_EQ(token, -1) << "a stop sequence names none";
  EXPECT_EQ(Stop(stop, {2}, {4, 3}, &token), std::nullopt) << "the sequence must end the tokens, in order";
  EXPECT_EQ(Stop(stop, {2}, {1, 1, 1, 1}, &token), std::nullopt);
  EXPECT_EQ(Stop(stop, {2}, {1, 1, 1, 1, 1}, &token), FinishReason::kLength);
  EXPECT_EQ(token, -1);
}

TEST(StopReasonTest, IgnoreEosKeepsGoingButStopIdsStillStop) {
  StopConditions stop;
  stop.max_tokens = 10;
  stop.ignore_eos = true;
  stop.stop_token_ids = {2};
  TokenId token = -1;
  EXPECT_EQ(Stop(stop, {9}, {1, 9}, &token), std::nullopt);
  EXPECT_EQ(Stop(stop, {9}, {1, 9, 2}, &token), FinishReason::kStop);
  EXPECT_EQ(token, 2);
}

TEST(StopReasonTest, AStopAtMaxTokensIsAStop) {
  StopConditions stop;
  stop.max_tokens = 2;
  TokenId token = -1;
  EXPECT_EQ(Stop(stop, {5}, {1, 5}, &token), FinishReason::kStop);
  EXPECT_EQ(token, 5);
}

TEST(PrefillCallForTest, CarriesTheRequestsPromptNamespaceAndSampling) {
  GenerateRequest r;
  r.request_id = "r1";
  r.prompt = {1, 2, 3};
  r.tenant = "t";
  r.cache_salt = "s";
  r.sampling.temperature = 0.5f;
  r.sampling.seed = 42;
  const prefill::PrefillRequest call = PrefillCallFor(r);
  EXPECT_EQ(call.request_id, "r1");
  EXPECT_EQ(call.prompt, r.prompt);
  EXPECT_EQ(call.tenant, "t");
  EXPECT_EQ(call.cache_salt, "s");
  EXPECT_EQ(call.sampling.temperature, 0.5f);
  EXPECT_EQ(call.sampling.seed, 42u);
  EXPECT_EQ(call.cancellation, nullptr);
}

}  // namespace
}  // namespace hybridserve::decode
