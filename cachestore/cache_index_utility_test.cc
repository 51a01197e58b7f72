// Utility eviction (EvictionPolicy::kUtility, cachestore/eviction_utility.h)
// in the index: what it keeps where LRU would not, aging, leaf pages, re-keying,
// leases and pins never evicted, and blend 1 as LRU.

#include <vector>

#include "cachestore/cache_index.h"
#include "cachestore/cache_index_test_fixture.h"
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
  // GreedyDual: each victim raises the clock, so a state used long ago goes
  // once newer entries have been keyed above its priority.
  CacheIndexOptions o = PayloadOnly();
  o.state_budget_bytes = 2000;
  Make(Utility(o));
  const std::vector<TokenId> t = Tokens(40, 0);
  PutPages(t, 10);
  const Hash128 deep = PutCommitted(StateSpec(t, 20));  // priority 0.020
  for (int p = 1; p <= 19 && index_->Contains(EntryClass::kState, deep); ++p) {
    PutCommitted(StateSpec(t, p, 1000 - 4 * (p % 4)));  // charge 1000; each evicts the other one
  }
  EXPECT_FALSE(index_->Contains(EntryClass::kState, deep));
}

TEST_F(CacheIndexTest, UtilityEvictsALeafPageWithNoStateBeforeAnOlderOneCarryingAState) {
  const std::vector<TokenId> a = Tokens(12, 0), b = Tokens(8, 50), c = Tokens(4, 80);
  for (const bool utility : {false, true}) {
    CacheIndexOptions o = PayloadOnly();
    o.page_budget_bytes = 500;
    Make(utility ? Utility(o) : o);
    PutPages(a, 3);
    PutCommitted(StateSpec(a, 12));  // hangs at a2, the oldest leaf
    now_ += absl::Seconds(1);
    PutPages(b, 2);  // no state: a hybrid model cannot resume from it
    now_ += absl::Seconds(1);
    PutPages(c, 1);  // needs room: LRU takes a2 (and the state), utility b1
    EXPECT_EQ(Lookup(a).resume_position, utility ? 12 : 0) << "utility " << utility;
    EXPECT_EQ(Lookup(b).kv_match_tokens, utility ? 4 : 8) << "utility " << utility;
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

}  // namespace
}  // namespace hybridserve::cachestore
