#include "bench/cachestore/cache_sim.h"

#include <vector>

#include "common/runfiles.h"
#include "engine/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::bench {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kOverhead = cachestore::CacheIndexOptions::kDefaultEntryOverheadBytes;

// The default model with pages of 16 tokens and checkpoints every 64.
ModelCost DefaultModel() {
  absl::StatusOr<engine::ModelConfig> config = engine::LoadModelConfig(common::Runfile("models/default/config.json"));
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ModelCost> cost = ModelCost::Create(*config, 16, 64);
  EXPECT_TRUE(cost.ok()) << cost.status();
  return *cost;
}

Trace Parse(const char* text) {
  absl::StatusOr<Trace> trace = ParseTrace(text);
  EXPECT_TRUE(trace.ok()) << trace.status();
  return *trace;
}

constexpr char kHeader[] = R"({"format": "hybridserve-trace/1", "name": "test"})"
                           "\n";

// One conversation: prompts of 40, 40+10+20 = 70 and 70+5+30 = 105 tokens.
Trace ThreeTurns() {
  return Parse((std::string(kHeader) + R"({"conv":0,"turn":0,"t":0,"user":40,"reply":10}
{"conv":0,"turn":1,"t":1,"user":20,"reply":5}
{"conv":0,"turn":2,"t":2,"user":30,"reply":1})")
                   .c_str());
}

TEST(CacheSimTest, EachTurnResumesFromThePreviousTurnEnd) {
  // Prompts: 40, 40+10+20 = 70, 70+5+30 = 105 tokens. The turn ends (the last
  // reply token is not fed) are at 49 and 74; turn 1 also put a grid
  // checkpoint at 64, which 74 is deeper than.
  const Trace trace = ThreeTurns();
  const ModelCost model = DefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->hits, ElementsAre(0, 49, 74));
  EXPECT_EQ(r->prompt_tokens, 40 + 70 + 105);
  EXPECT_EQ(r->hit_tokens, 49 + 74);
  EXPECT_DOUBLE_EQ(r->saved_flops, model.PrefixFlops(49) + model.PrefixFlops(74));
  // Pages: turn 0 puts 0-1 (prompt) and 2 (turn end at 49); turn 1 page 3;
  // turn 2 pages 4-5 (prompt of 105) and none more (turn end at 105).
  EXPECT_EQ(r->pages_written, 6);
  EXPECT_EQ(r->page_bytes_written, 6 * model.page_bytes());
  // States: 40, 49; 64 (grid), 70, 74; 105 (prompt end), and the turn end
  // at 105 + 1 - 1 = 105 is the same entry, already present.
  EXPECT_EQ(r->states_written, 6);
  EXPECT_EQ(r->state_bytes_written, model.StateBytes(40, true) + model.StateBytes(49, true) +
                                        model.StateBytes(64, false) + model.StateBytes(70, true) +
                                        model.StateBytes(74, true) + model.StateBytes(105, true));
  EXPECT_EQ(r->put_failures, 0);
  EXPECT_EQ(r->evictions(), 0);
  EXPECT_EQ(r->end.pages.entries, 6);
  EXPECT_EQ(r->end.states.entries, 6);
}

TEST(CacheSimTest, ConversationsShareTheirSystemPrompt) {
  // Both name shared prefix 7 (40 tokens): the second finds the first's
  // pages 0-1 but no state at a position it shares (the first's states are
  // at 45 and 54, past its own user text), so its hit is 0; a grid
  // checkpoint at 32 would be shared, so with an interval of 32 it hits 32.
  const Trace trace = Parse((std::string(kHeader) +
                             R"({"conv":0,"turn":0,"t":0,"user":5,"reply":10,"shared":7,"shared_units":40}
{"conv":1,"turn":0,"t":1,"user":6,"reply":10,"shared":7,"shared_units":40})")
                                .c_str());
  absl::StatusOr<engine::ModelConfig> config = engine::LoadModelConfig(common::Runfile("models/default/config.json"));
  ASSERT_TRUE(config.ok()) << config.status();
  CacheSimOptions options;
  options.tokens.vocab = config->vocab_size;
  for (int64_t interval : {64, 32}) {
    absl::StatusOr<ModelCost> model = ModelCost::Create(*config, 16, interval);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, *model, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->hits, ElementsAre(0, interval == 32 ? 32 : 0)) << "interval " << interval;
  }
}

TEST(CacheSimTest, TheBranchPointRuleLetsAThirdConversationResumeAtTheSharedPrefix) {
  // Shared prefix 7 of 70 tokens: the second conversation's pages match to 64
  // (page 4 holds token 64-69 of the prefix and 10 of its own), past its hit
  // of 0, so with no grid publication the rule puts the engine checkpoint at
  // 64 (the interval) and the third resumes there; without the rule it finds
  // no state. Exact branch points land at the page match, 64 too here.
  const Trace trace = Parse((std::string(kHeader) +
                             R"({"conv":0,"turn":0,"t":0,"user":5,"reply":10,"shared":7,"shared_units":70}
{"conv":1,"turn":0,"t":1,"user":6,"reply":10,"shared":7,"shared_units":70}
{"conv":2,"turn":0,"t":2,"user":7,"reply":10,"shared":7,"shared_units":70})")
                                .c_str());
  const ModelCost model = DefaultModel();  // pages of 16, checkpoints every 64
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.checkpoint_interval = -1;
  absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->hits, ElementsAre(0, 0, 0));
  for (auto rule : {CacheSimOptions::BranchPoints::kGrid, CacheSimOptions::BranchPoints::kExact}) {
    options.branch_points = rule;
    r = RunCacheSim(trace, model, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->hits, ElementsAre(0, 0, 64));
    // States: each prompt end and turn end, and one branch state at 64.
    EXPECT_EQ(r->states_written, 3 * 2 + 1);
  }
}

TEST(CacheSimTest, AdmissionWithoutGridCheckpointsAndTheLastTurnOracle) {
  // EachTurnResumesFromThePreviousTurnEnd's trace: without grid publication
  // the checkpoint at 64 is not written, and the hits are the same.
  const Trace trace = ThreeTurns();
  const ModelCost model = DefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.checkpoint_interval = -1;
  absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->hits, ElementsAre(0, 49, 74));
  EXPECT_EQ(r->states_written, 5);
  // The oracle publishes nothing of turn 2, the conversation's last.
  options.checkpoint_interval = 0;
  options.oracle_skip_last_turn = true;
  r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->hits, ElementsAre(0, 49, 74));
  EXPECT_EQ(r->pages_written, 4);
  EXPECT_EQ(r->states_written, 5);  // 40, 49, 64, 70, 74
}

TEST(CacheSimTest, ReuseIntervalsHoldEachTurnEndUntilTheNextTurn) {
  const Trace trace = Parse((std::string(kHeader) + R"({"conv":0,"turn":0,"t":0,"user":40,"reply":10}
{"conv":1,"turn":0,"t":0.5,"user":3,"reply":0}
{"conv":0,"turn":1,"t":1,"user":20,"reply":5}
{"conv":1,"turn":1,"t":1.5,"user":3,"reply":1}
{"conv":0,"turn":2,"t":2,"user":30,"reply":1})")
                                .c_str());
  const ModelCost model = DefaultModel();
  absl::StatusOr<std::vector<ReuseInterval>> r = ReuseIntervals(trace, model, TokenRule{1, model.vocab()}, kOverhead);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  const auto state = [&](int64_t m) { return model.StateBytes(m, true) + kOverhead + 4 * (m % 16); };
  const auto pages = [&](int64_t n) { return n * (model.page_bytes() + kOverhead); };
  // Conversation 0 ends turn 0 at 49 (3 pages), turn 1 at 74 (4 pages).
  EXPECT_EQ((*r)[0].conv, 0);
  EXPECT_EQ((*r)[0].turn, 1);
  EXPECT_DOUBLE_EQ((*r)[0].start_s, 0);
  EXPECT_DOUBLE_EQ((*r)[0].end_s, 1);
  EXPECT_EQ((*r)[0].tokens, 49);
  EXPECT_EQ((*r)[0].page_charge, pages(3));
  EXPECT_EQ((*r)[0].state_charge, state(49));
  EXPECT_DOUBLE_EQ((*r)[0].flops, model.PrefixFlops(49));
  // Conversation 1's first turn has no reply: its prompt end at 3 is the resume point.
  EXPECT_EQ((*r)[1].conv, 1);
  EXPECT_EQ((*r)[1].tokens, 3);
  EXPECT_EQ((*r)[1].page_charge, 0);
  EXPECT_EQ((*r)[1].state_charge, state(3));
  EXPECT_EQ((*r)[2].tokens, 74);
  EXPECT_EQ((*r)[2].page_charge, pages(4));
  EXPECT_DOUBLE_EQ((*r)[2].start_s, 1);
  EXPECT_DOUBLE_EQ((*r)[2].end_s, 2);

  const Trace shared = Parse(
      (std::string(kHeader) + R"({"conv":0,"turn":0,"t":0,"user":5,"reply":10,"shared":7,"shared_units":40})").c_str());
  EXPECT_EQ(ReuseIntervals(shared, model, TokenRule{1, model.vocab()}, kOverhead).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CacheSimTest, ASecondConversationEvictsTheFirstFromABudgetThatHoldsOne) {
  // A and B have the same shape: prompt 40, turn end at 49, so each leaves
  // pages 0-2 and states at 40 and 49. The budgets hold exactly that much.
  const Trace trace = Parse((std::string(kHeader) + R"({"conv":0,"turn":0,"t":0,"user":40,"reply":10}
{"conv":1,"turn":0,"t":1,"user":40,"reply":10}
{"conv":0,"turn":1,"t":2,"user":20,"reply":5})")
                                .c_str());
  const ModelCost model = DefaultModel();
  auto state_charge = [&](int64_t p) { return model.StateBytes(p, true) + kOverhead + 4 * (p % 16); };
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.index.page_budget_bytes = 3 * (model.page_bytes() + kOverhead);
  options.index.state_budget_bytes = state_charge(40) + state_charge(49);

  absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  // B's pages push out A's leaf-first (2, 1, 0), each taking A's state on it.
  // A's second turn then finds nothing; its pages 0-2 push out B's the same
  // way, and its page 3 finds no room (A's own 0-2 hold the budget, 2 pinned
  // as the parent), so the grid checkpoint at 64 and the states at 70 and 74
  // have no parent page: 4 failed puts.
  EXPECT_THAT(r->hits, ElementsAre(0, 0, 0));
  EXPECT_EQ(r->end.pages.evicted_lru, 6);
  EXPECT_EQ(r->end.states.dropped_with_pages, 4);
  EXPECT_EQ(r->end.states.evicted_lru, 0);
  EXPECT_EQ(r->put_failures, 4);
  EXPECT_EQ(r->end.pages.entries, 3);
  EXPECT_EQ(r->end.states.entries, 0);

  // Twice the budget holds both first turns: A resumes from its turn end
  // (and its new page and states then push out some of B's).
  options.index.page_budget_bytes *= 2;
  options.index.state_budget_bytes *= 2;
  r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->hits, ElementsAre(0, 0, 49));
}

TEST(CacheSimTest, UtilityWithFullRecencyBlendReplaysLruAndEveryPolicyKeepsTheBudgets) {
  // Three conversations interleaved at a budget that holds about one: many
  // evictions. Blend 1 gives every entry the same priority increment, so the
  // utility policy must replay LRU's choices exactly.
  const Trace trace = Parse((std::string(kHeader) + R"({"conv":0,"turn":0,"t":0,"user":40,"reply":10}
{"conv":1,"turn":0,"t":1,"user":90,"reply":10}
{"conv":0,"turn":1,"t":2,"user":20,"reply":5}
{"conv":2,"turn":0,"t":3,"user":30,"reply":40}
{"conv":1,"turn":1,"t":4,"user":20,"reply":5}
{"conv":0,"turn":2,"t":5,"user":20,"reply":5}
{"conv":2,"turn":1,"t":6,"user":10,"reply":5})")
                                .c_str());
  const ModelCost model = DefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.index.page_budget_bytes = 7 * (model.page_bytes() + kOverhead);
  options.index.state_budget_bytes = 3 * (model.StateBytes(64, true) + kOverhead);
  absl::StatusOr<CacheSimResult> lru = RunCacheSim(trace, model, options);
  ASSERT_TRUE(lru.ok()) << lru.status();
  EXPECT_GT(lru->evictions(), 0);
  for (const double blend : {1.0, 0.5, 0.0}) {
    options.index.eviction = cachestore::EvictionPolicy::kUtility;
    options.index.utility = {model.flops_per_token(), model.attention_flops_per_context_token(), blend};
    absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
    ASSERT_TRUE(r.ok()) << r.status();
    if (blend == 1.0) {
      EXPECT_EQ(r->hits, lru->hits);
      EXPECT_EQ(r->end.pages.evicted_lru, lru->end.pages.evicted_lru);
      EXPECT_EQ(r->end.states.evicted_lru, lru->end.states.evicted_lru);
      EXPECT_EQ(r->put_failures, lru->put_failures);
    }
    EXPECT_LE(r->page_charge(), options.index.page_budget_bytes) << "blend " << blend;
    EXPECT_LE(r->state_charge(), options.index.state_budget_bytes) << "blend " << blend;
  }
}

TEST(CacheSimTest, UtilitySavesMoreThanLruWhereADeepConversationReturnsAfterShallowOnes) {
  // A long conversation (400 tokens of history) and, while it waits for its
  // next turn, four short one-off conversations, at a state budget that
  // holds a few states and a page budget that holds everything. LRU evicts
  // the long conversation's turn end as the oldest state; utility keeps it
  // (it saves 20 times the FLOPs of a short one's per byte) and gives up the
  // short ones' states, which no later turn uses.
  const Trace trace = Parse((std::string(kHeader) + R"({"conv":0,"turn":0,"t":0,"user":400,"reply":10}
{"conv":1,"turn":0,"t":1,"user":20,"reply":5}
{"conv":2,"turn":0,"t":2,"user":20,"reply":5}
{"conv":3,"turn":0,"t":3,"user":20,"reply":5}
{"conv":4,"turn":0,"t":4,"user":20,"reply":5}
{"conv":0,"turn":1,"t":5,"user":20,"reply":5})")
                                .c_str());
  const ModelCost model = DefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.checkpoint_interval = -1;  // prompt-end and turn-end states only
  options.index.page_budget_bytes = 64 * (model.page_bytes() + kOverhead);
  options.index.state_budget_bytes = 4 * (model.StateBytes(410, true) + kOverhead + 64);
  absl::StatusOr<CacheSimResult> lru = RunCacheSim(trace, model, options);
  ASSERT_TRUE(lru.ok()) << lru.status();
  options.index.eviction = cachestore::EvictionPolicy::kUtility;
  options.index.utility = {model.flops_per_token(), model.attention_flops_per_context_token(), 0.0};
  absl::StatusOr<CacheSimResult> utility = RunCacheSim(trace, model, options);
  ASSERT_TRUE(utility.ok()) << utility.status();
  EXPECT_THAT(lru->hits, ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_THAT(utility->hits, ElementsAre(0, 0, 0, 0, 0, 409));  // the turn end: 400 + 10 - 1
  EXPECT_GT(utility->saved_flops, lru->saved_flops);
  EXPECT_GT(lru->end.states.evicted_lru, 0);
}

TEST(CacheSimTest, TracesOutOfOrderAreRefused) {
  EXPECT_FALSE(ParseTrace(std::string(kHeader) + R"({"conv":0,"turn":1,"t":0,"user":1,"reply":1})").ok());
  EXPECT_FALSE(ParseTrace(std::string(kHeader) + R"({"conv":0,"turn":0,"t":5,"user":1,"reply":1}
{"conv":0,"turn":1,"t":4,"user":1,"reply":1})")
                   .ok());
  EXPECT_FALSE(ParseTrace(R"({"conv":0,"turn":0,"t":0,"user":1,"reply":1})").ok());
}

TEST(TokenRuleTest, UnitsRoundUpPerSegmentAndIdsAreReproducible) {
  const TokenRule rule{4.0, 16384};
  EXPECT_EQ(rule.Tokens(0), 0);
  EXPECT_EQ(rule.Tokens(1), 1);
  EXPECT_EQ(rule.Tokens(8), 2);
  EXPECT_EQ(rule.Tokens(9), 3);
  std::vector<TokenId> a, b, c;
  rule.Append(3, 1, 2, 40, &a);
  rule.Append(3, 1, 2, 40, &b);
  rule.Append(4, 1, 2, 40, &c);
  EXPECT_EQ(a.size(), 10u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (TokenId t : a) EXPECT_TRUE(t >= 0 && t < 16384);
}

}  // namespace
}  // namespace hybridserve::bench
