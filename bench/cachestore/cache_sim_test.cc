#include "bench/cachestore/cache_sim.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachestore/client/shard_placement.h"
#include "cachestore/keys.h"
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

// Six conversations, three opening with the same 70-token system prompt
// (shared prefix 1), 24 turns.
Trace SixConversations() {
  return Parse((std::string(kHeader) + R"({"conv":2,"turn":0,"t":0.0,"user":24,"reply":51,"shared":1,"shared_units":70}
{"conv":5,"turn":0,"t":1.0,"user":11,"reply":10}
{"conv":4,"turn":0,"t":2.0,"user":17,"reply":47,"shared":1,"shared_units":70}
{"conv":4,"turn":1,"t":3.0,"user":12,"reply":65}
{"conv":1,"turn":0,"t":4.0,"user":9,"reply":12}
{"conv":3,"turn":0,"t":5.0,"user":58,"reply":9}
{"conv":1,"turn":1,"t":6.0,"user":16,"reply":71}
{"conv":3,"turn":1,"t":7.0,"user":12,"reply":73}
{"conv":0,"turn":0,"t":8.0,"user":33,"reply":75,"shared":1,"shared_units":70}
{"conv":0,"turn":1,"t":9.0,"user":78,"reply":75}
{"conv":3,"turn":2,"t":10.0,"user":11,"reply":29}
{"conv":0,"turn":2,"t":11.0,"user":76,"reply":18}
{"conv":2,"turn":1,"t":12.0,"user":58,"reply":19}
{"conv":4,"turn":2,"t":13.0,"user":20,"reply":74}
{"conv":2,"turn":2,"t":14.0,"user":76,"reply":24}
{"conv":0,"turn":3,"t":15.0,"user":79,"reply":74}
{"conv":5,"turn":1,"t":16.0,"user":29,"reply":48}
{"conv":0,"turn":4,"t":17.0,"user":75,"reply":9}
{"conv":4,"turn":3,"t":18.0,"user":12,"reply":80}
{"conv":1,"turn":2,"t":19.0,"user":68,"reply":69}
{"conv":3,"turn":3,"t":20.0,"user":104,"reply":41}
{"conv":3,"turn":4,"t":21.0,"user":79,"reply":59}
{"conv":2,"turn":3,"t":22.0,"user":43,"reply":32}
{"conv":1,"turn":3,"t":23.0,"user":94,"reply":32})")
                   .c_str());
}

// The default model as cache_sim_main.cc builds it (pages of 16, the
// engine's checkpoint interval).
ModelCost EngineDefaultModel() {
  absl::StatusOr<engine::ModelConfig> config = engine::LoadModelConfig(common::Runfile("models/default/config.json"));
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ModelCost> cost = ModelCost::Create(*config, 0, 0);
  EXPECT_TRUE(cost.ok()) << cost.status();
  return *cost;
}

TEST(CacheSimShardsTest, OneShardReplaysTheSimulatorBeforeShards) {
  // The numbers are the CSV rows of cache_sim as it was before shards (commit
  // 4dd7249) on this trace, budgets 1/8 and 1/4 of its working set
  // (--models=default:models/default/config.json:1 --fractions=0.125,0.25).
  const Trace trace = SixConversations();
  const ModelCost model = EngineDefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.index.blob_pool_bytes = 0;
  struct Row {
    int64_t page_budget, state_budget, hit_tokens, page_bytes, state_bytes, evictions, pages_evicted, states_evicted,
        dropped, put_failures, end_charge;
    double saved_flops;
  };
  for (const Row& row : {Row{298016, 1242787, 755, 3440640, 6936676, 228, 193, 7, 28, 41, 479368, 1.719063e+09},
                         Row{596032, 2485575, 1690, 3964928, 10066352, 257, 208, 6, 43, 6, 1153732, 3.910399e+09}}) {
    options.index.page_budget_bytes = row.page_budget;
    options.index.state_budget_bytes = row.state_budget;
    absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->turns, 24);
    EXPECT_EQ(r->prompt_tokens, 5298);
    EXPECT_EQ(r->hit_tokens, row.hit_tokens) << "budget " << row.page_budget;
    EXPECT_NEAR(r->saved_flops, row.saved_flops, 5e3);  // the CSV's 7 digits
    EXPECT_EQ(r->page_bytes_written, row.page_bytes);
    EXPECT_EQ(r->state_bytes_written, row.state_bytes);
    EXPECT_EQ(r->evictions(), row.evictions);
    EXPECT_EQ(r->end.pages.evicted_lru, row.pages_evicted);
    EXPECT_EQ(r->end.states.evicted_lru, row.states_evicted);
    EXPECT_EQ(r->end.states.dropped_with_pages, row.dropped);
    EXPECT_EQ(r->put_failures, row.put_failures);
    EXPECT_EQ(r->page_charge() + r->state_charge(), row.end_charge);
    ASSERT_EQ(r->shards.size(), 1u);
    EXPECT_EQ(r->shards[0].hit_tokens, r->hit_tokens);
    EXPECT_EQ(r->shards[0].turns, 24);
  }
}

// Each turn's owners among shard-0 .. shard-{n-1}, computed apart from the
// simulator: the conversation's tokens by the trace's token rule, the page
// keys in the simulator's namespace, and ShardPlacement over the chain key
// (kFirstPage) or the first page past the shared prefix (kFirstOwnPage), of
// the prompt (prefill's lookup and puts) and of the fed tokens (decode's).
struct TurnOwners {
  std::vector<int> prompt;
  std::vector<int> turn_end;
};
TurnOwners Owners(const Trace& trace, const ModelCost& model, const TokenRule& rule, int n,
                  CacheSimOptions::Placement placement) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(absl::StrCat("shard-", i));
  absl::StatusOr<cachestore::ShardPlacement> shards = cachestore::ShardPlacement::Create(names);
  EXPECT_TRUE(shards.ok()) << shards.status();
  const int32_t ps = model.page_size();
  const cachestore::Hash128 ns = cachestore::NamespaceKey("cache_sim", "", "tenant", "", ps);
  std::map<int64_t, std::vector<TokenId>> context;
  std::map<int64_t, size_t> own_page;
  TurnOwners owners;
  const auto owner = [&](int64_t conv, const std::vector<cachestore::Hash128>& keys) {
    cachestore::Hash128 key = keys.empty() ? ns : keys[0];
    if (placement == CacheSimOptions::Placement::kFirstOwnPage && own_page[conv] < keys.size()) {
      key = keys[own_page[conv]];
    }
    const std::string& name = shards->Owner(ns, key);
    return static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  for (const TraceTurn& turn : trace.turns) {
    std::vector<TokenId>& tokens = context[turn.conv];
    if (turn.turn == 0 && turn.shared >= 0) {
      rule.Append(turn.shared, 0, 0, turn.shared_units, &tokens);
      own_page[turn.conv] = tokens.size() / ps;
    }
    rule.Append(turn.conv, turn.turn, 1, turn.user_units, &tokens);
    owners.prompt.push_back(owner(turn.conv, cachestore::PageKeys(ns, tokens, ps)));
    rule.Append(turn.conv, turn.turn, 2, turn.reply_units, &tokens);
    const std::vector<TokenId> fed(tokens.begin(), tokens.end() - 1);
    owners.turn_end.push_back(owner(turn.conv, cachestore::PageKeys(ns, fed, ps)));
  }
  return owners;
}

TEST(CacheSimShardsTest, EveryCallOfATurnGoesToItsOwnerAndEachShardKeepsItsBudget) {
  const Trace trace = SixConversations();
  const ModelCost model = EngineDefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.index.blob_pool_bytes = 0;
  options.index.page_budget_bytes = 12 * (model.page_bytes() + kOverhead);
  options.index.state_budget_bytes = 2 * (model.StateBytes(256, true) + kOverhead);
  options.shards = 4;
  options.log_routing = true;
  for (const auto placement : {CacheSimOptions::Placement::kFirstPage, CacheSimOptions::Placement::kFirstOwnPage}) {
    SCOPED_TRACE(placement == CacheSimOptions::Placement::kFirstPage ? "first page" : "first own page");
    options.placement = placement;
    const TurnOwners turn_owners = Owners(trace, model, options.tokens, 4, placement);
    const std::vector<int>& owners = turn_owners.prompt;
    // The trace spreads over the shards, or routing would be untested.
    EXPECT_GE(std::set<int>(owners.begin(), owners.end()).size(), 3u);
    absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->turn_shard, owners);
    // Exactly one lookup per turn, first, and every Reserve and Commit of the
    // turn on its owner: prefill's on the prompt's, decode's on the fed
    // tokens' (the same here but where the prompt had no full page).
    std::vector<int> lookups(owners.size(), 0);
    std::vector<int64_t> commits(4, 0);
    int64_t puts = 0;
    int64_t last_turn = -1;
    for (const CacheSimCall& call : r->routing) {
      const bool lookup = call.kind == CacheSimCall::Kind::kLookup;
      ASSERT_GE(call.turn, 0);
      ASSERT_LT(call.turn, static_cast<int64_t>(owners.size()));
      EXPECT_EQ(call.shard, call.turn_end ? turn_owners.turn_end[call.turn] : owners[call.turn])
          << "turn " << call.turn
          << (lookup          ? " lookup"
              : call.turn_end ? " decode put"
                              : " prefill put");
      EXPECT_FALSE(lookup && call.turn_end);
      EXPECT_GE(call.turn, last_turn);
      if (lookup) {
        EXPECT_GT(call.turn, last_turn) << "a second lookup for turn " << call.turn;
        ++lookups[call.turn];
      } else {
        EXPECT_EQ(call.turn, last_turn) << "a put before its turn's lookup";
        ++puts;
      }
      if (call.kind == CacheSimCall::Kind::kCommit) ++commits[call.shard];
      last_turn = call.turn;
    }
    EXPECT_THAT(lookups, ::testing::Each(1));
    EXPECT_GT(puts, 0);
    // Each index saw the lookups of its own turns only, and the per-shard
    // shares add up to the run's totals.
    int64_t hit_tokens = 0, prompt_tokens = 0, page_entries = 0, state_entries = 0, evictions = 0;
    ASSERT_EQ(r->shards.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      const CacheSimShard& s = r->shards[i];
      EXPECT_EQ(s.name, absl::StrCat("shard-", i));
      EXPECT_EQ(s.end.lookups, std::count(owners.begin(), owners.end(), i)) << s.name;
      EXPECT_EQ(s.turns, s.end.lookups) << s.name;
      // The entries this index committed (held, evicted or dropped with
      // their page) are the commits logged for this shard's turns.
      int64_t committed = 0;
      for (const cachestore::ClassStats& c : {s.end.pages, s.end.states}) {
        committed += c.entries + c.evicted_lru + c.evicted_ttl + c.dropped_with_pages;
      }
      EXPECT_EQ(committed, commits[i]) << s.name;
      // Every shard has the budget, and keeps it.
      EXPECT_EQ(s.end.pages.budget_bytes, options.index.page_budget_bytes) << s.name;
      EXPECT_EQ(s.end.states.budget_bytes, options.index.state_budget_bytes) << s.name;
      EXPECT_LE(s.page_charge(), options.index.page_budget_bytes) << s.name;
      EXPECT_LE(s.state_charge(), options.index.state_budget_bytes) << s.name;
      hit_tokens += s.hit_tokens;
      prompt_tokens += s.prompt_tokens;
      page_entries += s.end.pages.entries;
      state_entries += s.end.states.entries;
      evictions += s.end.pages.evicted_lru + s.end.states.evicted_lru;
    }
    EXPECT_EQ(hit_tokens, r->hit_tokens);
    EXPECT_EQ(prompt_tokens, r->prompt_tokens);
    EXPECT_EQ(page_entries, r->end.pages.entries);
    EXPECT_EQ(state_entries, r->end.states.entries);
    EXPECT_EQ(r->end.lookups, 24);
    // The sum of the per-shard budgets holds everything.
    EXPECT_LE(r->page_charge(), 4 * options.index.page_budget_bytes);
    EXPECT_LE(r->state_charge(), 4 * options.index.state_budget_bytes);
    EXPECT_GT(evictions, 0);  // the budgets bind
  }
}

TEST(CacheSimShardsTest, AFirstPromptShorterThanAPageResumesWhereDecodePlacedTheTurnEnd) {
  // Turn 0's prompt (10 tokens) has no full page: prefill's puts go to the
  // owner of (ns, ns); the turn end at 39 has two, so decode places it and its
  // pages by their first page, where turn 1's lookup goes.
  const Trace trace = Parse((std::string(kHeader) + R"({"conv":0,"turn":0,"t":0,"user":10,"reply":30}
{"conv":0,"turn":1,"t":1,"user":20,"reply":5})")
                                .c_str());
  const ModelCost model = DefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  int apart = 0;
  for (int n = 1; n <= 8; ++n) {
    options.shards = n;
    absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->hits, ElementsAre(0, 39)) << n << " shards";
    EXPECT_EQ(r->put_failures, 0) << n << " shards";
    if (r->turn_shard[0] != r->turn_shard[1]) ++apart;
  }
  EXPECT_GT(apart, 0);  // some shard counts place the two chains apart
}

TEST(CacheSimShardsTest, ConversationsSharingAFirstPageShareAShardUnlessPlacedPastIt) {
  // Conversations 0, 2 and 4 open with the 70-token system prompt: placed by
  // their first page they land together; placed past the prompt they need not.
  const Trace trace = SixConversations();
  const ModelCost model = EngineDefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.shards = 4;
  absl::StatusOr<CacheSimResult> first = RunCacheSim(trace, model, options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.placement = CacheSimOptions::Placement::kFirstOwnPage;
  absl::StatusOr<CacheSimResult> own = RunCacheSim(trace, model, options);
  ASSERT_TRUE(own.ok()) << own.status();
  std::set<int> first_shards, own_shards;
  for (size_t i = 0; i < trace.turns.size(); ++i) {
    if (trace.turns[i].conv % 2 != 0) continue;
    first_shards.insert(first->turn_shard[i]);
    own_shards.insert(own->turn_shard[i]);
  }
  EXPECT_EQ(first_shards.size(), 1u);
  EXPECT_GT(own_shards.size(), 1u);
  options.shards = 0;
  EXPECT_EQ(RunCacheSim(trace, model, options).status().code(), absl::StatusCode::kInvalidArgument);
}

cachestore::Hash128 Key(uint64_t i) { return cachestore::Hash128{i, 0}; }
SimulatedDisk::File PageFileOf(int64_t bytes) {
  SimulatedDisk::File f;
  f.bytes = bytes;
  return f;
}

TEST(SimulatedDiskTest, ReadsAreUsesSpillsOfPresentKeysAreNotAndTheBudgetHolds) {
  CacheSimDisk stats;
  SimulatedDisk disk(100, 16, stats);
  for (uint64_t k : {1, 2, 3}) disk.Spill(Key(k), PageFileOf(30));
  EXPECT_EQ(disk.Read(Key(1)).bytes, 30);  // LRU order now 2, 3, 1
  disk.Spill(Key(4), PageFileOf(30));      // evicts 2
  EXPECT_EQ(disk.Find(Key(2)), nullptr);
  disk.Spill(Key(3), PageFileOf(30));  // present: not rewritten, not a use
  disk.Spill(Key(5), PageFileOf(40));  // evicts 3 (60 + 40 fit)
  EXPECT_EQ(disk.Find(Key(3)), nullptr);
  for (uint64_t k : {1, 4, 5}) EXPECT_NE(disk.Find(Key(k)), nullptr) << k;
  disk.Spill(Key(6), PageFileOf(101));  // larger than the budget
  EXPECT_EQ(disk.Find(Key(6)), nullptr);
  EXPECT_EQ(disk.files(), 3);
  EXPECT_EQ(disk.bytes(), 100);
  EXPECT_EQ(stats.files_written, 5);
  EXPECT_EQ(stats.bytes_written, 160);
  EXPECT_EQ(stats.spills_present, 1);
  EXPECT_EQ(stats.spills_refused, 1);
  EXPECT_EQ(stats.evictions, 2);
  EXPECT_EQ(stats.files_read, 1);
  EXPECT_EQ(stats.bytes_read, 30);
}

TEST(SimulatedDiskTest, StatesAreFoundByTheirNodesTailLengthsUntilEvicted) {
  CacheSimDisk stats;
  SimulatedDisk disk(100, 16, stats);
  SimulatedDisk::File state;
  state.entry_class = cachestore::EntryClass::kState;
  state.node = Key(7);
  state.bytes = 40;
  state.position = 2 * 16 + 5;
  disk.Spill(Key(1), state);
  state.position = 2 * 16 + 3;
  disk.Spill(Key(2), state);
  const std::map<int64_t, int>* lengths = disk.TailLengths(Key(7));
  ASSERT_NE(lengths, nullptr);
  EXPECT_THAT(*lengths, ElementsAre(std::pair<const int64_t, int>{3, 1}, std::pair<const int64_t, int>{5, 1}));
  EXPECT_EQ(disk.TailLengths(Key(8)), nullptr);
  disk.Spill(Key(3), PageFileOf(40));  // evicts the state of tail 5
  lengths = disk.TailLengths(Key(7));
  ASSERT_NE(lengths, nullptr);
  EXPECT_THAT(*lengths, ElementsAre(std::pair<const int64_t, int>{3, 1}));
  disk.Spill(Key(4), PageFileOf(60));  // evicts the other
  EXPECT_EQ(disk.TailLengths(Key(7)), nullptr);
}

// The disk tier (cache_sim.h). A file's bytes: the entry's, the file and
// record overhead, and 4 bytes per token it carries.
int64_t PageFile(const ModelCost& model) { return model.page_bytes() + kSimDiskFileOverheadBytes + 4 * 16; }
int64_t StateFile(const ModelCost& model, int64_t p) {
  return model.StateBytes(p, true) + kSimDiskFileOverheadBytes + 4 * (p % 16);
}

// ASecondConversationEvictsTheFirstFromABudgetThatHoldsOne's trace and
// budgets: A, then B (which pushes all of A out), then A's second turn.
Trace AThenBThenA() {
  return Parse((std::string(kHeader) + R"({"conv":0,"turn":0,"t":0,"user":40,"reply":10}
{"conv":1,"turn":0,"t":1,"user":40,"reply":10}
{"conv":0,"turn":1,"t":2,"user":20,"reply":5})")
                   .c_str());
}
CacheSimOptions HoldsOneConversation(const ModelCost& model) {
  auto state_charge = [&](int64_t p) { return model.StateBytes(p, true) + kOverhead + 4 * (p % 16); };
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.index.page_budget_bytes = 3 * (model.page_bytes() + kOverhead);
  options.index.state_budget_bytes = state_charge(40) + state_charge(49);
  return options;
}

TEST(CacheSimDiskTest, WhatMemoryEvictedIsPromotedFromDiskAtTheDeepestState) {
  const Trace trace = AThenBThenA();
  const ModelCost model = DefaultModel();
  CacheSimOptions options = HoldsOneConversation(model);
  options.disk_budget_bytes = int64_t{1} << 40;
  absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  // B's puts evict A's pages 2, 1, 0 with the states at 49 (on page 2) and
  // 40 (on page 1): all five spill. A's second turn (prompt 70) finds
  // nothing in memory; on disk its pages 0-2 and both states, and takes the
  // deeper, 49: it reads the three pages and that state, and their puts push
  // B's five entries out to disk the same way. The lookup again: 49.
  EXPECT_THAT(r->memory_hits, ElementsAre(0, 0, 0));
  EXPECT_THAT(r->hits, ElementsAre(0, 0, 49));
  EXPECT_EQ(r->hit_tokens, 49);
  EXPECT_EQ(r->memory_hit_tokens(), 0);
  EXPECT_EQ(r->disk.hits, 1);
  EXPECT_EQ(r->disk.hit_tokens, 49);
  EXPECT_DOUBLE_EQ(r->disk.saved_flops, model.PrefixFlops(49));
  EXPECT_DOUBLE_EQ(r->saved_flops, model.PrefixFlops(49));
  EXPECT_DOUBLE_EQ(r->memory_saved_flops(), 0);
  const int64_t conversation_files = 3 * PageFile(model) + StateFile(model, 40) + StateFile(model, 49);
  EXPECT_EQ(r->disk.files_written, 10);
  EXPECT_EQ(r->disk.bytes_written, 2 * conversation_files);
  EXPECT_EQ(r->disk.files_read, 4);
  EXPECT_EQ(r->disk.bytes_read, 3 * PageFile(model) + StateFile(model, 49));
  EXPECT_EQ(r->disk.evictions, 0);
  EXPECT_EQ(r->disk.spills_present, 0);
  EXPECT_EQ(r->disk.promotion_failures, 0);
  EXPECT_EQ(r->disk.files, 10);
  EXPECT_EQ(r->disk.bytes, 2 * conversation_files);
  EXPECT_EQ(r->disk.budget_bytes, int64_t{1} << 40);
  // The promotion wrote nothing as a publication: A's turn 1 then fails as
  // without a disk (page 3 finds no room, the states at 64, 70 and 74 no
  // parent page).
  EXPECT_EQ(r->pages_written, 6);
  EXPECT_EQ(r->states_written, 4);
  EXPECT_EQ(r->put_failures, 4);

  // Without the disk tier: no hit, and nothing of the disk counted.
  options.disk_budget_bytes = 0;
  r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->hits, ElementsAre(0, 0, 0));
  EXPECT_EQ(r->disk.files_written, 0);
  EXPECT_EQ(r->disk.budget_bytes, 0);
  options.disk_budget_bytes = -1;
  EXPECT_EQ(RunCacheSim(trace, model, options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CacheSimDiskTest, ADiskLookupTakesTheLongestTailAtTheDeepestNode) {
  // ThreeTurns' conversation A with B's first turn before A's last, and a
  // state budget of one state: every state but the newest spills. A's turn 1
  // (prompt 70) resumes at 49 in memory and puts 64 (grid), 70 and 74, all
  // on page 4's node (tails 0, 6, 10); B's states push A's 74 out. A's turn
  // 2 (prompt 105) finds pages 0-3 and no state in memory; on disk 40 (node
  // 2), 49 (node 3) and the three at node 4: it takes 74, the longest tail
  // of the deepest node, and promotes only that state (page 4 was never put).
  const Trace trace = Parse((std::string(kHeader) + R"({"conv":0,"turn":0,"t":0,"user":40,"reply":10}
{"conv":0,"turn":1,"t":1,"user":20,"reply":5}
{"conv":1,"turn":0,"t":2,"user":40,"reply":10}
{"conv":0,"turn":2,"t":3,"user":30,"reply":1})")
                                .c_str());
  const ModelCost model = DefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.index.state_budget_bytes = model.StateBytes(74, true) + kOverhead + 4 * 10;
  options.disk_budget_bytes = int64_t{1} << 40;
  absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->memory_hits, ElementsAre(0, 49, 0, 0));
  EXPECT_THAT(r->hits, ElementsAre(0, 49, 0, 74));
  EXPECT_EQ(r->disk.hits, 1);
  EXPECT_EQ(r->disk.files_read, 1);
  EXPECT_EQ(r->disk.bytes_read, StateFile(model, 74));
  EXPECT_EQ(r->disk.promotion_failures, 0);
}

TEST(CacheSimDiskTest, TheDiskKeepsItsBudgetByLruAndRefusesAFileLargerThanIt) {
  const Trace trace = AThenBThenA();
  const ModelCost model = DefaultModel();
  CacheSimOptions options = HoldsOneConversation(model);
  // Three page files: no state file fits (each is larger than the budget).
  options.disk_budget_bytes = 3 * PageFile(model);
  ASSERT_GT(StateFile(model, 40), options.disk_budget_bytes);
  absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  // A's pages spill, its states are refused; A's turn 1 promotes nothing
  // (no state on disk), and its publication of pages 0-2 pushes B's pages
  // out: they spill over A's (the least recently used), B's states refused.
  EXPECT_THAT(r->hits, ElementsAre(0, 0, 0));
  EXPECT_EQ(r->disk.spills_refused, 4);
  EXPECT_EQ(r->disk.files_written, 6);
  EXPECT_EQ(r->disk.files_read, 0);
  EXPECT_EQ(r->disk.evictions, 3);
  EXPECT_EQ(r->disk.files, 3);
  EXPECT_EQ(r->disk.bytes, 3 * PageFile(model));

  // Three pages and the state at 49 (the state at 40 is larger: 8 tokens of
  // tail KV to 49's 1). B's evictions spill A's state 49, page 2 (the LRU
  // order: s49 p2), then state 40, which pushes both out, pages 1 and 0:
  // the disk holds s40 p1 p0, so A's turn 1 resumes at 40, not 49. Its
  // promotion reads p0 p1 s40 (now the most recent) and its two page puts
  // push out B's pages 2 and 1 with their states: s49B evicts p0, p2B p1,
  // s40B s40 and s49B, p1B fits. A's page 2 then pushes out B's page 0,
  // whose file evicts p2B. 10 spills, 7 evictions, s40B p1B p0B at the end.
  options.disk_budget_bytes = 3 * PageFile(model) + StateFile(model, 49);
  r = RunCacheSim(trace, model, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->memory_hits, ElementsAre(0, 0, 0));
  EXPECT_THAT(r->hits, ElementsAre(0, 0, 40));
  EXPECT_EQ(r->disk.spills_refused, 0);
  EXPECT_EQ(r->disk.files_written, 10);
  EXPECT_EQ(r->disk.files_read, 3);
  EXPECT_EQ(r->disk.bytes_read, 2 * PageFile(model) + StateFile(model, 40));
  EXPECT_EQ(r->disk.evictions, 7);
  EXPECT_EQ(r->disk.files, 3);
  EXPECT_EQ(r->disk.bytes, 2 * PageFile(model) + StateFile(model, 40));
}

TEST(CacheSimDiskTest, ShardsEachHaveADiskAndTheTiersAddUpToTheHits) {
  const Trace trace = SixConversations();
  const ModelCost model = EngineDefaultModel();
  CacheSimOptions options;
  options.tokens.vocab = model.vocab();
  options.index.blob_pool_bytes = 0;
  absl::StatusOr<CacheSimResult> unlimited = RunCacheSim(trace, model, options);
  ASSERT_TRUE(unlimited.ok()) << unlimited.status();
  for (int shards : {1, 4}) {
    // OneShardReplaysTheSimulatorBeforeShards' 1/8 budgets, each shard.
    options.shards = shards;
    options.index.page_budget_bytes = 298016;
    options.index.state_budget_bytes = 1242787;
    options.disk_budget_bytes = 0;
    absl::StatusOr<CacheSimResult> memory = RunCacheSim(trace, model, options);
    ASSERT_TRUE(memory.ok()) << memory.status();
    for (int64_t disk_budget : {int64_t{1} << 20, int64_t{1} << 40}) {
      options.disk_budget_bytes = disk_budget;
      absl::StatusOr<CacheSimResult> r = RunCacheSim(trace, model, options);
      ASSERT_TRUE(r.ok()) << r.status();
      SCOPED_TRACE(absl::StrCat(shards, " shards, disk ", disk_budget));
      EXPECT_EQ(r->disk.budget_bytes, shards * disk_budget);
      EXPECT_LE(r->disk.bytes, r->disk.budget_bytes);
      EXPECT_GT(r->disk.hits, 0);
      int64_t disk_tokens = 0, disk_turns = 0;
      for (size_t i = 0; i < r->hits.size(); ++i) {
        EXPECT_GE(r->hits[i], r->memory_hits[i]) << "turn " << i;
        EXPECT_LE(r->hits[i], unlimited->hits[i]) << "turn " << i;
        disk_tokens += r->hits[i] - r->memory_hits[i];
        disk_turns += r->hits[i] > r->memory_hits[i];
      }
      EXPECT_EQ(r->disk.hit_tokens, disk_tokens);
      EXPECT_EQ(r->disk.hits, disk_turns);
      EXPECT_EQ(r->memory_hit_tokens() + r->disk.hit_tokens, r->hit_tokens);
      EXPECT_GT(r->hit_tokens, memory->hit_tokens);
      EXPECT_EQ(r->turn_shard, memory->turn_shard);  // the disk does not move a turn
    }
  }
}

}  // namespace
}  // namespace hybridserve::bench
