// Utility eviction (EvictionPolicy::kUtility, cachestore/index/eviction_utility.h)
// in the index: what it keeps where LRU would not, aging, leaf pages, re-keying,
// leases and pins never evicted, blend 1 as LRU, and the model cost each
// namespace registers (PutSpec::model_cost).

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cachestore/index/cache_index.h"
#include "cachestore/testing/cache_index_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

// --- Utility eviction (EvictionPolicy::kUtility) ------------------------------

CacheIndexOptions Utility(CacheIndexOptions o, double blend = 0) {
  o.eviction = EvictionPolicy::kUtility;
  o.utility = UtilityCost{/*flops_per_token=*/1, /*flops_per_token_context=*/0, blend};
  return o;
}

TEST_F(CacheIndexTest, UtilityKeepsADeepStateWhereLruEvictsIt) {
  const std::vector<TokenId> t = Tokens(20, 0);
  for (const bool utility : {false, true}) {
    CacheIndexOptions o = PayloadOnly();
    o.state_budget_bytes = 3000;  // three states of 1000 bytes with empty tails
    Make(utility ? Utility(o) : o);
    PutPages(t, 5);
    const Hash128 deep = PutCommitted(StateSpec(t, 20));  // saves 20 tokens, the oldest
    now_ += absl::Seconds(1);
    std::vector<Hash128> shallow;
    for (int p : {4, 8, 12}) shallow.push_back(PutCommitted(StateSpec(t, p)));  // the third makes room
    EXPECT_EQ(index_->Contains(EntryClass::kState, deep), utility) << "utility " << utility;
    // Utility evicts the state saving least (at 4): its priority is the lowest.
    EXPECT_EQ(index_->Contains(EntryClass::kState, shallow[0]), !utility) << "utility " << utility;
    EXPECT_EQ(Lookup(t).resume_position, utility ? 20 : 12);
    EXPECT_EQ(index_->Stats().states.evicted_lru, 1);
    ASSERT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  }
}

TEST_F(CacheIndexTest, UtilityAgesOldHighValueStatesOut) {
  // GreedyDual: a state saving much outlives newer ones saving little (LRU
  // evicts it at the first put that needs room), but each victim raises the
  // clock, so it goes once newer entries have been keyed above its priority.
  for (const bool utility : {false, true}) {
    CacheIndexOptions o = PayloadOnly();
    o.state_budget_bytes = 2000;
    Make(utility ? Utility(o) : o);
    const std::vector<TokenId> t = Tokens(40, 0);
    PutPages(t, 10);
    const Hash128 deep = PutCommitted(StateSpec(t, 20));  // priority 0.020
    int puts = 0;                                         // puts it outlived
    for (int p = 1; p <= 19 && index_->Contains(EntryClass::kState, deep); ++p) {
      now_ += absl::Seconds(1);
      PutCommitted(StateSpec(t, p, 1000 - 4 * (p % 4)));  // charge 1000; each evicts the other one
      if (index_->Contains(EntryClass::kState, deep)) ++puts;
    }
    EXPECT_FALSE(index_->Contains(EntryClass::kState, deep)) << "utility " << utility;
    // LRU: the second put needs room and takes the oldest. Utility: the
    // victim at p raises the clock to about (1 + ... + p) / 1000, past the
    // deep state's 0.020 after p = 6, so the seventh put takes it.
    EXPECT_EQ(puts, utility ? 6 : 1) << "utility " << utility;
    ASSERT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  }
}

TEST_F(CacheIndexTest, UtilityKeepsAPublicationsFreshPagesForTheStateThatFollowsThem) {
  // A publication puts its pages, then their state. A leaf page with no state
  // yet is worth the state to come at its end, so a put in that gap takes the
  // older chain, as LRU does, and the state still finds its parent. (Valued at
  // nothing, b1 went first and b's state was refused: replay_trace.py saw it.)
  const std::vector<TokenId> a = Tokens(12, 0), b = Tokens(8, 50), c = Tokens(4, 80);
  for (const bool utility : {false, true}) {
    CacheIndexOptions o = PayloadOnly();
    o.page_budget_bytes = 500;
    Make(utility ? Utility(o) : o);
    PutPages(a, 3);
    PutCommitted(StateSpec(a, 12));  // hangs at a2, the oldest leaf
    now_ += absl::Seconds(1);
    PutPages(b, 2);  // b's state is on its way
    now_ += absl::Seconds(1);
    PutPages(c, 1);  // needs room: a2 goes, with a's state
    PutCommitted(StateSpec(b, 8));
    EXPECT_EQ(Lookup(a).resume_position, 0) << "utility " << utility;
    EXPECT_EQ(Lookup(b).resume_position, 8) << "utility " << utility;
    ASSERT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  }
}

TEST_F(CacheIndexTest, UtilityTakesTheLeafWhoseChainSavesLeastPerByte) {
  // Pages of 4 tokens, a token costs 1: a's chain of 3 pages carries a state
  // at 15 (5 per page), b's of 2 pages one at 8 (4 per page). c's put takes
  // b1 under utility although b was used last; LRU takes a2.
  const std::vector<TokenId> a = Tokens(16, 0), b = Tokens(12, 50), c = Tokens(4, 80);
  for (const bool utility : {false, true}) {
    CacheIndexOptions o = PayloadOnly();
    o.page_budget_bytes = 500;
    Make(utility ? Utility(o) : o);
    PutPages(a, 3);
    PutCommitted(StateSpec(a, 15));
    now_ += absl::Seconds(1);
    PutPages(b, 2);
    PutCommitted(StateSpec(b, 8));
    now_ += absl::Seconds(1);
    PutPages(c, 1);
    EXPECT_EQ(Lookup(a).resume_position, utility ? 15 : 0) << "utility " << utility;
    EXPECT_EQ(Lookup(b).resume_position, utility ? 0 : 8) << "utility " << utility;
    ASSERT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  }
}

TEST_F(CacheIndexTest, UtilityRekeysALeafPageWhenItsStateGoes) {
  CacheIndexOptions o = PayloadOnly();
  o.page_budget_bytes = 300;
  o.state_budget_bytes = 1000;
  Make(Utility(o));
  const std::vector<TokenId> a = Tokens(8, 0), b = Tokens(4, 50);
  PutPages(a, 1);
  PutCommitted(StateSpec(a, 4));
  now_ += absl::Seconds(1);
  PutPages(b, 1);
  PutCommitted(StateSpec(b, 4));  // evicts a's state: a0 now saves nothing
  ASSERT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  PutCommitted(PageSpec(Tokens(4, 80), 0));
  PutCommitted(PageSpec(Tokens(4, 90), 0));  // evicts a0, not b0 which carries b's state
  EXPECT_EQ(Lookup(a).kv_match_tokens, 0);
  EXPECT_EQ(Lookup(b).resume_position, 4);
}

TEST_F(CacheIndexTest, UtilityNeverEvictsLeasedOrPinnedEntries) {
  CacheIndexOptions o = PayloadOnly();
  o.page_budget_bytes = 2000;   // 20 pages
  o.state_budget_bytes = 5000;  // 5 states
  o.pin_budget_bytes = 2000;
  Make(Utility(o));
  // Two low-utility states (1 page each, at 4): one leased, one pinned.
  const std::vector<TokenId> leased = Tokens(4, 0), pinned = Tokens(4, 100);
  PutPages(leased, 1);
  PutCommitted(StateSpec(leased, 4));
  const LookupResult lease = Lookup(leased, /*lease=*/true);
  ASSERT_NE(lease.lease_id, 0u);
  PutPages(pinned, 1);
  PutSpec pin = StateSpec(pinned, 4);
  pin.pin = true;
  auto r = index_->Reserve(pin, now_);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->pinned);
  ASSERT_TRUE(index_->Commit(r->id, 7, now_).ok());
  // A flood of deep, high-utility conversations.
  for (int i = 0; i < 30; ++i) {
    now_ += absl::Seconds(1);
    const std::vector<TokenId> other = Tokens(16, 5000 + 100 * i);
    PutPages(other, 4);
    PutCommitted(StateSpec(other, 16));
    ASSERT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  }
  EXPECT_EQ(Lookup(pinned).resume_position, 4);
  EXPECT_TRUE(index_->Open(lease.lease_id, lease.state->key, now_).ok());
  ASSERT_TRUE(index_->Release(lease.lease_id).ok());
  const IndexStats st = index_->Stats();
  EXPECT_GT(st.states.evicted_lru, 20);
  EXPECT_LE(st.pages.resident_bytes, 2000);
  EXPECT_LE(st.states.resident_bytes, 5000);
}

TEST_F(CacheIndexTest, UtilityWithFullRecencyBlendIsLru) {
  // Blend 1: every increment is 1, so the order is the use order.
  CacheIndexOptions o = PayloadOnly();
  o.state_budget_bytes = 3000;
  Make(Utility(o, /*blend=*/1));
  const std::vector<TokenId> t = Tokens(20, 0);
  PutPages(t, 5);
  const Hash128 deep = PutCommitted(StateSpec(t, 20));
  for (int p : {4, 8, 12}) PutCommitted(StateSpec(t, p));
  EXPECT_FALSE(index_->Contains(EntryClass::kState, deep));
}

// --- Per-namespace model costs (PutSpec::model_cost) ----------------------------

TEST_F(CacheIndexTest, UtilityValuesEachNamespaceByItsRegisteredModelCost) {
  // Two models in one cache: a large one (1000 FLOPs a token) and a small one
  // (1). Room for two states; the third evicts one. Under the fallback cost
  // alone (1 FLOP a token for both), the large model's state at 2 saves less
  // per byte than the small model's at 3 and goes; with the registered costs
  // it saves 1000 times more, and the small model's state goes instead.
  const Hash128 large_ns = NamespaceKey("large", "", "", "", kPageSize);
  const Hash128 small_ns = NamespaceKey("small", "", "", "", kPageSize);
  const std::vector<TokenId> t = Tokens(3, 0);
  for (const bool registered : {false, true}) {
    CacheIndexOptions o = PayloadOnly();
    o.state_budget_bytes = 2100;  // two states of 1000 bytes and their tails (4 bytes a token)
    Make(Utility(o));
    auto state = [&](const Hash128& ns, int64_t p, double flops_per_token) {
      ns_ = ns;
      PutSpec s = StateSpec(t, p);
      if (registered) s.model_cost = PrefillCost{flops_per_token, 0};
      return s;
    };
    const Hash128 large = PutCommitted(state(large_ns, 2, 1000));  // 2000 FLOPs / 1008 bytes (fallback: 2 / 1008)
    const Hash128 small = PutCommitted(state(small_ns, 3, 1));     // 3 / 1012
    PutCommitted(state(small_ns, 1, 1));                           // needs room
    EXPECT_EQ(index_->Contains(EntryClass::kState, large), registered) << "registered " << registered;
    EXPECT_EQ(index_->Contains(EntryClass::kState, small), !registered) << "registered " << registered;
    EXPECT_EQ(index_->Stats().states.evicted_lru, 1);
    EXPECT_EQ(index_->Stats().namespaces_with_model_cost, registered ? 2 : 0);
    ASSERT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  }
}

TEST_F(CacheIndexTest, ANamespaceKeepsTheLatestModelCostAPutCarriesUntilItEmpties) {
  Make(Utility(PayloadOnly()));
  const std::vector<TokenId> t = Tokens(8, 0);
  PutSpec first = PageSpec(t, 0);
  first.model_cost = PrefillCost{10, 0.5};
  auto r = index_->Reserve(first, now_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->model_cost_registered);
  ASSERT_TRUE(index_->Commit(r->id, 7, now_).ok());
  EXPECT_EQ(index_->ModelCostOf(ns_), (PrefillCost{10, 0.5}));

  // The same again registers nothing new; a put without one keeps it.
  PutSpec again = PageSpec(t, 1);
  again.model_cost = PrefillCost{10, 0.5};
  r = index_->Reserve(again, now_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->model_cost_registered);
  ASSERT_TRUE(index_->Commit(r->id, 7, now_).ok());
  r = index_->Reserve(StateSpec(t, 5), now_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->model_cost_registered);
  EXPECT_EQ(index_->ModelCostOf(ns_), (PrefillCost{10, 0.5}));

  // Another cost, on a put of a page already present: the latest wins.
  PutSpec other = PageSpec(t, 0);
  other.model_cost = PrefillCost{20, 0};
  r = index_->Reserve(other, now_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->already_present);
  EXPECT_TRUE(r->model_cost_registered);
  EXPECT_EQ(index_->ModelCostOf(ns_), (PrefillCost{20, 0}));
  EXPECT_EQ(index_->Stats().namespaces_with_model_cost, 1);

  // Emptied, the namespace forgets it.
  index_->RemoveCorrupt(EntryClass::kPage, PageKeys(ns_, t, kPageSize)[0]);
  EXPECT_EQ(index_->Stats().namespaces, 0);
  EXPECT_EQ(index_->ModelCostOf(ns_), std::nullopt);
  EXPECT_EQ(index_->Stats().namespaces_with_model_cost, 0);
  PutCommitted(PageSpec(t, 0));
  EXPECT_EQ(index_->ModelCostOf(ns_), std::nullopt);
}

TEST_F(CacheIndexTest, AModelCostThatIsNotAFiniteNonNegativeNumberIsInvalidNamingTheField) {
  const std::vector<TokenId> t = Tokens(4, 0);
  const struct {
    PrefillCost cost;
    const char* field;
  } cases[] = {
      {{-1, 0}, "flops_per_token -1"},
      {{std::nan(""), 0}, "flops_per_token nan"},
      {{std::numeric_limits<double>::infinity(), 0}, "flops_per_token inf"},
      {{1, 2e30}, "flops_per_token_context 2e+30"},
      {{1, -0.5}, "flops_per_token_context -0.5"},
  };
  for (const auto& c : cases) {
    PutSpec s = PageSpec(t, 0);
    s.model_cost = c.cost;
    const absl::Status status = index_->Reserve(s, now_).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr(c.field));
  }
  EXPECT_EQ(index_->Stats().namespaces, 0);
  PutSpec limit = PageSpec(t, 0);
  limit.model_cost = PrefillCost{kMaxPrefillFlops, 0};
  EXPECT_TRUE(index_->Reserve(limit, now_).ok());
}

}  // namespace
}  // namespace hybridserve::cachestore
