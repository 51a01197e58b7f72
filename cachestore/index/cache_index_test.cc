#include "cachestore/index/cache_index.h"

#include <numeric>
#include <vector>

#include "cachestore/testing/cache_index_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

TEST_F(CacheIndexTest, EmptyIndexMisses) {
  LookupResult r = Lookup(Tokens(10));
  EXPECT_EQ(r.resume_position, 0);
  EXPECT_EQ(r.kv_match_tokens, 0);
  EXPECT_FALSE(r.state.has_value());
  EXPECT_EQ(r.lease_id, 0u);
}

TEST_F(CacheIndexTest, ResumePointIsDeepestStateWhosePagesArePresent) {
  std::vector<TokenId> t = Tokens(20);
  PutPages(t, 4);  // tokens [0, 16)
  PutCommitted(StateSpec(t, 6));
  Hash128 deep = PutCommitted(StateSpec(t, 14, 1000, StateKind::kGridCheckpoint));

  LookupResult r = Lookup(t);
  EXPECT_EQ(r.resume_position, 14);
  EXPECT_EQ(r.kv_match_tokens, 16);
  ASSERT_EQ(r.pages.size(), 3u);  // pages [0, 12); tokens 12, 13 are in the snapshot
  EXPECT_EQ(r.pages[2].key, PageKeys(ns_, t, kPageSize)[2]);
  ASSERT_TRUE(r.state.has_value());
  EXPECT_EQ(r.state->key, deep);
  EXPECT_EQ(r.state->state_kind, StateKind::kGridCheckpoint);

  // The same prompt ending exactly at the snapshot resumes at its end.
  EXPECT_EQ(Lookup(absl::MakeConstSpan(t).subspan(0, 14)).resume_position, 14);
  // One token short of it: the snapshot is past the prompt.
  EXPECT_EQ(Lookup(absl::MakeConstSpan(t).subspan(0, 13)).resume_position, 6);
}

TEST_F(CacheIndexTest, DivergingTailFallsBackToShallowerState) {
  std::vector<TokenId> t = Tokens(20);
  PutPages(t, 4);
  PutCommitted(StateSpec(t, 6));
  PutCommitted(StateSpec(t, 14));
  std::vector<TokenId> other = t;
  other[13] = 7;  // inside the snapshot's tail, and inside page 3
  LookupResult r = Lookup(other);
  EXPECT_EQ(r.resume_position, 6);
  EXPECT_EQ(r.kv_match_tokens, 12);
  EXPECT_EQ(r.pages.size(), 1u);
}

TEST_F(CacheIndexTest, KvMatchBeyondTheDeepestStateIsReportedNotUsed) {
  std::vector<TokenId> t = Tokens(32);
  PutPages(t, 8);
  PutCommitted(StateSpec(t, 5));
  LookupResult r = Lookup(t);
  EXPECT_EQ(r.resume_position, 5);
  EXPECT_EQ(r.kv_match_tokens, 32);
  EXPECT_EQ(r.pages.size(), 1u);
}

TEST_F(CacheIndexTest, ReservedEntriesAreInvisibleUntilCommitted) {
  std::vector<TokenId> t = Tokens(8);
  auto page = index_->Reserve(PageSpec(t, 0), now_);
  ASSERT_TRUE(page.ok());
  auto state = index_->Reserve(StateSpec(t, 6), now_);
  ASSERT_TRUE(state.ok()) << state.status();  // a reserved parent is enough to start
  EXPECT_EQ(Lookup(t).kv_match_tokens, 0);
  ASSERT_TRUE(index_->Commit(state->id, 1, now_).ok());
  EXPECT_EQ(Lookup(t).resume_position, 0);  // its page is still in flight
  ASSERT_TRUE(index_->Commit(page->id, 1, now_).ok());
  EXPECT_EQ(Lookup(t).resume_position, 6);
  EXPECT_EQ(index_->Stats().pages.reserved_bytes, 0);
}

TEST_F(CacheIndexTest, DuplicatePutsReportPresenceOrConflict) {
  std::vector<TokenId> t = Tokens(8);
  auto first = index_->Reserve(PageSpec(t, 0), now_);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(index_->Reserve(PageSpec(t, 0), now_).status().code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(index_->Commit(first->id, 1, now_).ok());
  auto again = index_->Reserve(PageSpec(t, 0), now_);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->already_present);
  EXPECT_EQ(again->key, first->key);
  EXPECT_EQ(index_->Stats().pages.resident_bytes, 100);
}

TEST_F(CacheIndexTest, BadPutsAreRejectedAndChangeNothing) {
  std::vector<TokenId> t = Tokens(12);
  PutPages(t, 1);
  const IndexStats before = index_->Stats();

  PutSpec missing_parent = PageSpec(t, 2);  // page 1 was never stored
  EXPECT_EQ(index_->Reserve(missing_parent, now_).status().code(), absl::StatusCode::kFailedPrecondition);

  PutSpec short_page = PageSpec(t, 1);
  short_page.tokens.pop_back();
  EXPECT_EQ(index_->Reserve(short_page, now_).status().code(), absl::StatusCode::kInvalidArgument);

  PutSpec negative_size = PageSpec(t, 1, -1);
  EXPECT_EQ(index_->Reserve(negative_size, now_).status().code(), absl::StatusCode::kInvalidArgument);
  PutSpec empty_state = StateSpec(t, 5, 0);
  EXPECT_EQ(index_->Reserve(empty_state, now_).status().code(), absl::StatusCode::kInvalidArgument);

  PutSpec huge = PageSpec(t, 1, int64_t{2} << 30);
  EXPECT_EQ(index_->Reserve(huge, now_).status().code(), absl::StatusCode::kResourceExhausted);

  PutSpec negative = PageSpec(t, 1);
  negative.tokens[0] = -1;
  EXPECT_EQ(index_->Reserve(negative, now_).status().code(), absl::StatusCode::kInvalidArgument);

  PutSpec odd_page = PageSpec(t, 1);
  odd_page.page_size = 3;
  EXPECT_EQ(index_->Reserve(odd_page, now_).status().code(), absl::StatusCode::kInvalidArgument);

  PutSpec wrong_page_size = PageSpec(t, 0);
  wrong_page_size.page_size = 8;
  wrong_page_size.tokens = Tokens(8);
  EXPECT_EQ(index_->Reserve(wrong_page_size, now_).status().code(), absl::StatusCode::kInvalidArgument);

  PutSpec bad_position = StateSpec(t, 6);
  bad_position.position = 7;
  EXPECT_EQ(index_->Reserve(bad_position, now_).status().code(), absl::StatusCode::kInvalidArgument);

  PutSpec long_tail = StateSpec(t, 6);
  long_tail.tokens = Tokens(kPageSize);
  long_tail.position = 4 + kPageSize;
  EXPECT_EQ(index_->Reserve(long_tail, now_).status().code(), absl::StatusCode::kInvalidArgument);

  PutSpec at_zero = StateSpec(t, 0);
  EXPECT_EQ(index_->Reserve(at_zero, now_).status().code(), absl::StatusCode::kInvalidArgument);

  PutSpec other_ns_parent = PageSpec(t, 1);
  other_ns_parent.ns = NamespaceKey("other", "", "", "", kPageSize);
  EXPECT_EQ(index_->Reserve(other_ns_parent, now_).status().code(), absl::StatusCode::kFailedPrecondition);

  const IndexStats after = index_->Stats();
  EXPECT_EQ(after.pages.resident_bytes, before.pages.resident_bytes);
  EXPECT_EQ(after.pages.reserved_bytes, 0);
  EXPECT_EQ(after.namespaces, 1);
}

TEST_F(CacheIndexTest, NamespacesNeverShareEntries) {
  std::vector<TokenId> t = Tokens(8);
  PutPages(t, 2);
  PutCommitted(StateSpec(t, 8 - 1));
  Hash128 tenant = NamespaceKey("model", "", "", "tenant-b", kPageSize);
  auto r = index_->Lookup(tenant, kPageSize, PageKeys(tenant, t, kPageSize), t, true, now_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kv_match_tokens, 0);
  EXPECT_EQ(r->resume_position, 0);
}

TEST_F(CacheIndexTest, PagesAreEvictedLeafFirstInLruOrder) {
  CacheIndexOptions o = PayloadOnly();
  o.page_budget_bytes = 300;
  Make(o);
  std::vector<TokenId> a = Tokens(8, 0), b = Tokens(8, 50), c = Tokens(8, 80);
  PutPages(a, 2);  // a0 -> a1
  now_ += absl::Seconds(1);
  PutPages(b, 1);  // b0, newer than a0 and a1
  now_ += absl::Seconds(1);
  PutPages(c, 1);  // needs room: the LRU leaf is a1, not the older interior a0
  EXPECT_EQ(Lookup(a).kv_match_tokens, 4);
  EXPECT_EQ(Lookup(b).kv_match_tokens, 4);
  EXPECT_EQ(Lookup(c).kv_match_tokens, 4);
  EXPECT_EQ(index_->Stats().pages.evicted_lru, 1);
}

TEST_F(CacheIndexTest, UseRefreshesLruPosition) {
  CacheIndexOptions o = PayloadOnly();
  o.page_budget_bytes = 200;
  Make(o);
  std::vector<TokenId> a = Tokens(4, 0), b = Tokens(4, 50), c = Tokens(4, 80);
  PutPages(a, 1);
  PutPages(b, 1);
  Lookup(a);  // a is now more recent than b
  PutPages(c, 1);
  EXPECT_EQ(Lookup(a).kv_match_tokens, 4);
  EXPECT_EQ(Lookup(b).kv_match_tokens, 0);
}

TEST_F(CacheIndexTest, EvictingAPageDropsTheStatesThatNeedIt) {
  CacheIndexOptions o = PayloadOnly();
  o.page_budget_bytes = 200;
  Make(o);
  std::vector<TokenId> a = Tokens(12, 0);
  PutPages(a, 2);
  PutCommitted(StateSpec(a, 9));             // needs pages 0 and 1
  PutCommitted(PageSpec(Tokens(4, 50), 0));  // evicts a1 and the state at 9 with it
  EXPECT_EQ(Lookup(a).resume_position, 0);
  EXPECT_EQ(Lookup(a).kv_match_tokens, 4);
  IndexStats s = index_->Stats();
  EXPECT_EQ(s.states.entries, 0);
  EXPECT_EQ(s.states.resident_bytes, 0);
  EXPECT_EQ(s.states.dropped_with_pages, 1);
}

TEST_F(CacheIndexTest, LeasedEntriesSurviveBudgetPressure) {
  CacheIndexOptions o = PayloadOnly();
  o.page_budget_bytes = 200;
  o.state_budget_bytes = 1100;  // a state of 1000 bytes and a 1-token tail
  Make(o);
  std::vector<TokenId> a = Tokens(12, 0);
  PutPages(a, 2);
  PutCommitted(StateSpec(a, 9));  // needs pages 0 and 1
  LookupResult leased = Lookup(a, /*lease=*/true);
  ASSERT_NE(leased.lease_id, 0u);
  // a0 is pinned and interior; a1 is pinned and carries a pinned state.
  EXPECT_EQ(index_->Reserve(PageSpec(Tokens(4, 50), 0), now_).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(index_->Reserve(StateSpec(Tokens(4, 50), 3), now_).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(index_->Open(leased.lease_id, leased.state->key, now_).ok());
  ASSERT_TRUE(index_->Release(leased.lease_id).ok());
  EXPECT_EQ(index_->Release(leased.lease_id).code(), absl::StatusCode::kNotFound);
  PutCommitted(PageSpec(Tokens(4, 50), 0));
  EXPECT_EQ(Lookup(a).resume_position, 0);
}

TEST_F(CacheIndexTest, ReservedBytesCountAgainstTheBudget) {
  CacheIndexOptions o = PayloadOnly();
  o.state_budget_bytes = 1500;
  Make(o);
  std::vector<TokenId> a = Tokens(4, 0), b = Tokens(4, 10);
  auto first = index_->Reserve(StateSpec(a, 3), now_);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(index_->Reserve(StateSpec(b, 3), now_).status().code(), absl::StatusCode::kResourceExhausted);
  index_->Abort(first->id);
  EXPECT_TRUE(index_->Reserve(StateSpec(b, 3), now_).ok());
}

TEST_F(CacheIndexTest, IdleEntriesExpireByClassTtl) {
  CacheIndexOptions o = PayloadOnly();
  o.page_ttl = absl::Seconds(100);
  o.state_ttl = absl::Seconds(10);
  Make(o);
  std::vector<TokenId> a = Tokens(8, 0);
  PutPages(a, 2);
  PutCommitted(StateSpec(a, 6));
  now_ += absl::Seconds(11);
  index_->Expire(now_);
  LookupResult r = Lookup(a);  // also refreshes the pages
  EXPECT_EQ(r.resume_position, 0);
  EXPECT_EQ(r.kv_match_tokens, 8);
  EXPECT_EQ(index_->Stats().states.evicted_ttl, 1);
  now_ += absl::Seconds(101);
  index_->Expire(now_);  // both pages go: a1 as a leaf, then a0 as the new leaf
  EXPECT_EQ(Lookup(a).kv_match_tokens, 0);
  EXPECT_EQ(index_->Stats().pages.evicted_ttl, 2);
  EXPECT_EQ(index_->Stats().namespaces, 0);
}

TEST_F(CacheIndexTest, LeasesOfVanishedReadersExpire) {
  CacheIndexOptions o = PayloadOnly();
  o.lease_ttl = absl::Seconds(5);
  o.state_ttl = absl::Seconds(1);
  Make(o);
  std::vector<TokenId> a = Tokens(8, 0);
  PutPages(a, 2);
  PutCommitted(StateSpec(a, 6));
  LookupResult leased = Lookup(a, true);
  now_ += absl::Seconds(3);
  index_->Expire(now_);  // state idle past its TTL, but leased: kept
  EXPECT_TRUE(index_->Contains(EntryClass::kState, leased.state->key));
  now_ += absl::Seconds(3);
  index_->Expire(now_);  // the lease expired first, then the state could go
  EXPECT_FALSE(index_->Contains(EntryClass::kState, leased.state->key));
  EXPECT_EQ(index_->Open(leased.lease_id, leased.pages[0].key, now_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(index_->Stats().expired_leases, 1);
}

TEST_F(CacheIndexTest, StalledPutsAreReclaimed) {
  CacheIndexOptions o = PayloadOnly();
  o.put_timeout = absl::Seconds(2);
  Make(o);
  std::vector<TokenId> a = Tokens(8, 0);
  auto r = index_->Reserve(PageSpec(a, 0), now_);
  ASSERT_TRUE(r.ok());
  now_ += absl::Seconds(1);
  ASSERT_TRUE(index_->Touch(r->id, now_).ok());
  now_ += absl::Seconds(1.5);
  EXPECT_TRUE(index_->Expire(now_).empty());  // progress extended the deadline
  now_ += absl::Seconds(3);
  EXPECT_THAT(index_->Expire(now_), ::testing::ElementsAre(r->id));
  EXPECT_EQ(index_->Commit(r->id, 1, now_).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(index_->Stats().pages.reserved_bytes, 0);
  EXPECT_EQ(index_->Stats().namespaces, 0);
}

TEST_F(CacheIndexTest, AbortingAPageDropsWhatHangsFromIt) {
  std::vector<TokenId> a = Tokens(12, 0);
  auto p0 = index_->Reserve(PageSpec(a, 0), now_);
  ASSERT_TRUE(p0.ok());
  Hash128 p1 = PutCommitted(PageSpec(a, 1));
  auto s = index_->Reserve(StateSpec(a, 9), now_);
  ASSERT_TRUE(s.ok());
  index_->Abort(p0->id);
  EXPECT_FALSE(index_->Contains(EntryClass::kPage, p1));
  EXPECT_EQ(index_->Commit(s->id, 1, now_).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(index_->Stats().namespaces, 0);
}

TEST_F(CacheIndexTest, CorruptPageTakesItsDescendantsWithIt) {
  std::vector<TokenId> a = Tokens(12, 0);
  PutPages(a, 3);
  PutCommitted(StateSpec(a, 10));
  PutCommitted(StateSpec(a, 2));
  std::vector<Hash128> keys = PageKeys(ns_, a, kPageSize);
  index_->RemoveCorrupt(EntryClass::kPage, keys[1]);
  LookupResult r = Lookup(a);
  EXPECT_EQ(r.kv_match_tokens, 4);
  EXPECT_EQ(r.resume_position, 2);
  EXPECT_EQ(index_->Stats().checksum_failures, 1);
}

TEST_F(CacheIndexTest, EvictingTheRootsLastChildToMakeRoomKeepsTheNamespace) {
  CacheIndexOptions o = PayloadOnly();
  o.page_budget_bytes = 100;
  o.state_budget_bytes = 1100;  // a state of 1000 bytes and a 1-token tail
  Make(o);
  PutCommitted(PageSpec(Tokens(4, 0), 0));
  PutCommitted(PageSpec(Tokens(4, 10), 0));  // evicts the root's only child
  EXPECT_EQ(index_->Stats().namespaces, 1);
  EXPECT_EQ(Lookup(Tokens(4, 10)).kv_match_tokens, 4);
  PutCommitted(StateSpec(Tokens(4, 0), 1));
  PutCommitted(StateSpec(Tokens(4, 10), 1));  // evicts the root's only state
  EXPECT_EQ(Lookup(Tokens(4, 10)).resume_position, 1);
}

TEST_F(CacheIndexTest, ALeaseNeverPinsAnEntryStoredAgainUnderTheSameKey) {
  std::vector<TokenId> t = Tokens(6, 0);
  PutPages(t, 1);
  PutCommitted(StateSpec(t, 5));
  LookupResult leased = Lookup(t, true);
  ASSERT_NE(leased.lease_id, 0u);
  index_->RemoveCorrupt(EntryClass::kPage, leased.pages[0].key);
  Hash128 again = PutCommitted(PageSpec(t, 0));
  EXPECT_EQ(again, leased.pages[0].key);
  EXPECT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  EXPECT_EQ(index_->Open(leased.lease_id, again, now_).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(index_->Release(leased.lease_id).ok());
  EXPECT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
}

TEST_F(CacheIndexTest, LookupRejectsTooManyTokens) {
  CacheIndexOptions o = PayloadOnly();
  o.max_tokens = 16;
  Make(o);
  std::vector<TokenId> t = Tokens(17);
  EXPECT_EQ(index_->Lookup(ns_, kPageSize, PageKeys(ns_, t, kPageSize), t, false, now_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --- Session retention (TTL and pin on a state) -----------------------------

TEST_F(CacheIndexTest, PinnedSessionSurvivesAFloodThatEvictsEverythingUnpinned) {
  CacheIndexOptions o = PayloadOnly();
  o.page_budget_bytes = 2000;    // 20 pages
  o.state_budget_bytes = 10000;  // 10 states
  o.pin_budget_bytes = 5000;
  Make(o);
  const std::vector<TokenId> session = Tokens(22, 0);
  const std::vector<TokenId> plain = Tokens(22, 1000);
  PutPages(session, 5);
  PutPages(plain, 5);
  PutSpec pinned = StateSpec(session, 22);
  pinned.pin = true;
  pinned.ttl = absl::Hours(1);
  auto r = index_->Reserve(pinned, now_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->pinned);
  EXPECT_EQ(r->ttl, absl::Hours(1));
  EXPECT_TRUE(r->pin_refused.empty());
  ASSERT_TRUE(index_->Commit(r->id, 7, now_).ok());
  PutCommitted(StateSpec(plain, 22));
  // A flood of other conversations: 40 chains of 3 pages and a state each,
  // twice the page budget and four times the state budget.
  for (int i = 0; i < 40; ++i) {
    now_ += absl::Seconds(1);
    const std::vector<TokenId> other = Tokens(13, 5000 + 100 * i);
    PutPages(other, 3);
    PutCommitted(StateSpec(other, 13));
    ASSERT_TRUE(index_->CheckInvariants().ok()) << index_->CheckInvariants();
  }
  EXPECT_EQ(Lookup(session).resume_position, 22);  // the state and its five pages
  EXPECT_EQ(Lookup(session).kv_match_tokens, 20);
  EXPECT_EQ(Lookup(plain).resume_position, 0);
  EXPECT_EQ(Lookup(plain).kv_match_tokens, 0);
  const IndexStats st = index_->Stats();
  EXPECT_EQ(st.pinned_states, 1);
  EXPECT_EQ(st.pinned_bytes, 1000);
  EXPECT_GT(st.states.evicted_lru + st.states.dropped_with_pages, 30);
  EXPECT_GT(st.pages.evicted_lru, 60);
}

TEST_F(CacheIndexTest, ASessionGoesAtItsTtlAndFreesItsPages) {
  CacheIndexOptions o = PayloadOnly();
  o.state_ttl = absl::Hours(10);
  o.page_ttl = absl::Seconds(5);
  Make(o);
  const std::vector<TokenId> t = Tokens(10, 0);
  PutPages(t, 2);
  PutSpec kept = StateSpec(t, 10);
  kept.pin = true;
  kept.ttl = absl::Seconds(30);
  PutCommitted(kept);
  now_ += absl::Seconds(20);  // past the page TTL: the pages stay for the pinned state
  index_->Expire(now_);
  EXPECT_EQ(Lookup(t).resume_position, 10);  // a use: the session's 30 s start again
  now_ += absl::Seconds(29);
  index_->Expire(now_);
  EXPECT_EQ(index_->Stats().pinned_states, 1);
  now_ += absl::Seconds(2);
  index_->Expire(now_);
  EXPECT_EQ(index_->Stats().pinned_states, 0);
  EXPECT_EQ(index_->Stats().states.entries, 0);
  EXPECT_EQ(index_->Stats().states.evicted_ttl, 1);
  // The pages, unheld and idle past their TTL, go at the next Expire.
  index_->Expire(now_);
  EXPECT_EQ(Lookup(t).kv_match_tokens, 0);
}

TEST_F(CacheIndexTest, AnUnpinnedSessionTtlShortensOrLengthensOnlyThatState) {
  CacheIndexOptions o = PayloadOnly();
  o.state_ttl = absl::Seconds(100);
  o.max_session_ttl = absl::Seconds(500);
  Make(o);
  const std::vector<TokenId> a = Tokens(3, 0), b = Tokens(3, 10), c = Tokens(3, 20);
  PutCommitted(StateSpec(a, 3));  // class TTL 100 s
  PutSpec longer = StateSpec(b, 3);
  longer.ttl = absl::Hours(5);  // capped at 500 s
  auto r = index_->Reserve(longer, now_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ttl, absl::Seconds(500));
  EXPECT_FALSE(r->pinned);
  ASSERT_TRUE(index_->Commit(r->id, 7, now_).ok());
  PutSpec shorter = StateSpec(c, 3);
  shorter.ttl = absl::Seconds(10);
  PutCommitted(shorter);
  now_ += absl::Seconds(11);
  index_->Expire(now_);
  EXPECT_EQ(Lookup(c).resume_position, 0);
  EXPECT_EQ(Lookup(a).resume_position, 3);
  now_ += absl::Seconds(101);
  index_->Expire(now_);
  EXPECT_EQ(Lookup(a).resume_position, 0);
  EXPECT_EQ(Lookup(b).resume_position, 3);
  now_ += absl::Seconds(501);
  index_->Expire(now_);
  EXPECT_EQ(Lookup(b).resume_position, 0);
}

TEST_F(CacheIndexTest, PinsBeyondTheTenantQuotaOrTheBudgetAreRefusedNotFailed) {
  CacheIndexOptions o = PayloadOnly();
  o.pin_quota_bytes = 2500;
  o.pin_budget_bytes = 2500;
  Make(o);
  std::vector<Reservation> got;
  for (int i = 0; i < 3; ++i) {
    PutSpec spec = StateSpec(Tokens(3, 10 * i), 3);
    spec.pin = true;
    auto r = index_->Reserve(spec, now_);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(index_->Commit(r->id, 7, now_).ok());
    got.push_back(*r);
  }
  EXPECT_TRUE(got[0].pinned && got[1].pinned);
  EXPECT_FALSE(got[2].pinned);
  EXPECT_THAT(got[2].pin_refused, ::testing::HasSubstr("pin quota of 2500"));
  EXPECT_EQ(got[0].ttl, o.max_session_ttl);  // a pin without a TTL gets the longest
  // Another tenant has its own quota, but the cache's budget is shared.
  const Hash128 other = NamespaceKey("model", "", "tenant-b", "", kPageSize);
  PutSpec spec = StateSpec(Tokens(3, 90), 3);
  spec.ns = other;
  spec.tenant = "tenant-b";
  spec.pin = true;
  auto r = index_->Reserve(spec, now_);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->pinned);
  EXPECT_THAT(r->pin_refused, ::testing::HasSubstr("pin budget of 2500"));
  index_->Abort(r->id);
  // Re-putting a present state with a pin upgrades it once there is room.
  CacheIndexOptions roomy;
  Make(roomy);
  PutCommitted(StateSpec(Tokens(3, 0), 3));
  PutSpec again = StateSpec(Tokens(3, 0), 3);
  again.pin = true;
  auto present = index_->Reserve(again, now_);
  ASSERT_TRUE(present.ok());
  EXPECT_TRUE(present->already_present);
  EXPECT_TRUE(present->pinned);
  EXPECT_EQ(index_->Stats().pinned_states, 1);
}

// A tenant's salts narrow its sharing, not widen its quota: every namespace
// of one tenant draws on one pin quota, and the quota comes back as its
// pinned states go.
TEST_F(CacheIndexTest, OneTenantsSaltsShareItsPinQuota) {
  CacheIndexOptions o = PayloadOnly();
  o.pin_quota_bytes = 2500;
  Make(o);
  auto pin_in = [&](const std::string& tenant, const std::string& salt, int seed) {
    PutSpec spec = StateSpec(Tokens(3, seed), 3);
    spec.ns = NamespaceKey("model", "", tenant, salt, kPageSize);
    spec.tenant = tenant;
    spec.pin = true;
    auto r = index_->Reserve(spec, now_);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) EXPECT_TRUE(index_->Commit(r->id, 7, now_).ok());
    return r.ok() ? *r : Reservation{};
  };
  EXPECT_TRUE(pin_in("org_a", "s1", 0).pinned);
  EXPECT_TRUE(pin_in("org_a", "s2", 10).pinned);
  const Reservation third = pin_in("org_a", "s3", 20);
  EXPECT_FALSE(third.pinned);
  EXPECT_THAT(third.pin_refused, ::testing::HasSubstr("tenant's pin quota of 2500"));
  EXPECT_TRUE(pin_in("org_b", "s1", 30).pinned);  // another tenant: its own quota
  EXPECT_EQ(index_->Stats().pinned_states, 3);
  EXPECT_TRUE(index_->CheckInvariants().ok());
}

TEST_F(CacheIndexTest, RetentionIsForStatesAndNeverNegative) {
  Make(CacheIndexOptions{});
  PutSpec page = PageSpec(Tokens(4), 0);
  page.pin = true;
  EXPECT_EQ(index_->Reserve(page, now_).status().code(), absl::StatusCode::kInvalidArgument);
  PutSpec state = StateSpec(Tokens(3), 3);
  state.ttl = -absl::Seconds(1);
  auto r = index_->Reserve(state, now_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("ttl"));
}

// --- Hardening (issue 10): every byte counted, costs independent of size ----

// Item 1: a state's tail tokens and each entry's index memory count against
// the class budget. Before, 1,500 one-byte states with long tails grew the
// server by 380 MiB with the budgets untouched.
TEST_F(CacheIndexTest, TailTokensAndIndexMemoryCountAgainstTheBudget) {
  CacheIndexOptions o;  // the default per-entry overhead
  o.state_budget_bytes = 4 << 20;
  Make(o);
  constexpr int32_t kLongPage = 4096;
  const Hash128 ns = NamespaceKey("model", "", "", "", kLongPage);
  int64_t committed = 0;
  for (int i = 0; i < 1500; ++i) {
    PutSpec s;
    s.ns = ns;
    s.page_size = kLongPage;
    s.entry_class = EntryClass::kState;
    s.tokens = Tokens(kLongPage - 1, i * 7);  // distinct tails of 4095 tokens
    s.position = kLongPage - 1;
    s.size_bytes = 1;
    auto r = index_->Reserve(s, now_);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(index_->Commit(r->id, 1, now_).ok());
    ++committed;
    const ClassStats st = index_->Stats().states;
    ASSERT_LE(st.resident_bytes + st.reserved_bytes + st.metadata_bytes, st.budget_bytes) << "after state " << i;
  }
  const ClassStats st = index_->Stats().states;
  const int64_t charge = 1 + CacheIndexOptions::kDefaultEntryOverheadBytes + (kLongPage - 1) * 4;
  EXPECT_EQ(st.metadata_bytes, st.entries * (charge - 1));
  EXPECT_EQ(st.entries, (4 << 20) / charge);  // what fits; the rest was evicted
  EXPECT_EQ(st.evicted_lru, committed - st.entries);
  // A tail whose charge alone is larger than the budget is refused up front.
  CacheIndexOptions tiny;
  tiny.state_budget_bytes = 1000;
  Make(tiny);
  PutSpec s = StateSpec(Tokens(3), 3, /*size=*/1000 - CacheIndexOptions::kDefaultEntryOverheadBytes - 3 * 4 + 1);
  auto r = index_->Reserve(s, now_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("(1001 with its index memory) exceeds the state budget"));
  s.size_bytes -= 1;
  EXPECT_TRUE(index_->Reserve(s, now_).ok());
}

// Item 2: a lease names only its deepest page, and still serves exactly the
// pages of its own chain: every ancestor, never a page of a sibling branch at
// the same depth, nor a page below its deepest.
TEST_F(CacheIndexTest, ALeaseServesExactlyThePagesOfItsChain) {
  constexpr int kPages = 37;  // several jump-pointer levels
  std::vector<TokenId> a = Tokens(kPages * kPageSize + 3, 0);
  std::vector<TokenId> b = a;
  for (size_t i = 20 * kPageSize; i < b.size(); ++i) b[i] += 5000;  // shares pages [0, 20)
  PutPages(a, kPages);
  PutPages(b, kPages);
  const int64_t leased_depth = 30;
  PutCommitted(StateSpec(a, leased_depth * kPageSize + 2));
  std::vector<TokenId> prompt(a.begin(), a.begin() + leased_depth * kPageSize + 2);
  LookupResult r = Lookup(prompt, /*lease=*/true);
  ASSERT_EQ(r.pages.size(), static_cast<size_t>(leased_depth));
  const std::vector<Hash128> keys_a = PageKeys(ns_, a, kPageSize);
  const std::vector<Hash128> keys_b = PageKeys(ns_, b, kPageSize);
  for (int d = 0; d < kPages; ++d) {
    absl::StatusOr<ReadHandle> h = index_->Open(r.lease_id, keys_a[d], now_);
    EXPECT_EQ(h.ok(), d < leased_depth) << "page " << d << " of the leased chain: " << h.status();
    if (h.ok()) EXPECT_EQ(h->info.position, (d + 1) * kPageSize);
    const absl::StatusCode other = index_->Open(r.lease_id, keys_b[d], now_).status().code();
    EXPECT_EQ(other, d < 20 && d < leased_depth ? absl::StatusCode::kOk : absl::StatusCode::kNotFound)
        << "page " << d << " of the sibling chain";
  }
  EXPECT_TRUE(index_->Release(r.lease_id).ok());
}

// Item 2: open leases are bounded by max_leases; beyond it a leasing lookup
// is RESOURCE_EXHAUSTED naming the option, a probe still answers, and a
// release makes room again.
TEST_F(CacheIndexTest, LeasesAreBoundedByMaxLeases) {
  CacheIndexOptions o = PayloadOnly();
  o.max_leases = 3;
  Make(o);
  std::vector<TokenId> t = Tokens(9);
  PutPages(t, 2);
  PutCommitted(StateSpec(t, 9));
  std::vector<uint64_t> leases;
  for (int i = 0; i < 3; ++i) leases.push_back(Lookup(t, /*lease=*/true).lease_id);
  auto refused = index_->Lookup(ns_, kPageSize, PageKeys(ns_, t, kPageSize), t, /*lease=*/true, now_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("max_leases=3"));
  EXPECT_EQ(Lookup(t, /*lease=*/false).resume_position, 9);
  ASSERT_TRUE(index_->Release(leases[0]).ok());
  EXPECT_NE(Lookup(t, /*lease=*/true).lease_id, 0u);
  EXPECT_EQ(index_->Stats().active_leases, 3);
}

// Namespaces are bounded by max_namespaces: a put that would open one more is
// RESOURCE_EXHAUSTED and leaves nothing behind; puts into existing ones go on.
TEST_F(CacheIndexTest, NamespacesAreBoundedByMaxNamespaces) {
  CacheIndexOptions o = PayloadOnly();
  o.max_namespaces = 2;
  Make(o);
  PutCommitted(PageSpec(Tokens(4), 0, 100, NamespaceKey("m1", "", "", "", kPageSize)));
  PutCommitted(PageSpec(Tokens(4), 0, 100, NamespaceKey("m2", "", "", "", kPageSize)));
  auto r = index_->Reserve(PageSpec(Tokens(4), 0, 100, NamespaceKey("m3", "", "", "", kPageSize)), now_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("max_namespaces=2"));
  EXPECT_EQ(index_->Stats().namespaces, 2);
  PutCommitted(PageSpec(Tokens(4, 7), 0, 100, NamespaceKey("m1", "", "", "", kPageSize)));
  EXPECT_EQ(index_->Stats().pages.entries, 3);
}

// Item 6: an entry the machine cannot allocate is RESOURCE_EXHAUSTED naming
// its size, and leaves nothing behind: no namespace, no reservation, no bytes.
TEST_F(CacheIndexTest, AnAllocationTheMachineCannotMakeLeavesNothingBehind) {
  CacheIndexOptions o;
  o.page_budget_bytes = int64_t{1} << 62;
  o.state_budget_bytes = int64_t{1} << 62;
  o.blob_pool_bytes = 0;
  Make(o);
  PutSpec huge = StateSpec(Tokens(3), 3, int64_t{1} << 60);
  auto r = index_->Reserve(huge, now_);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("cannot allocate 1152921504606846976 bytes"));
  const IndexStats st = index_->Stats();
  EXPECT_EQ(st.namespaces, 0);
  EXPECT_EQ(st.active_puts, 0);
  EXPECT_EQ(st.states.reserved_bytes + st.states.metadata_bytes, 0);
  EXPECT_FALSE(index_->Contains(EntryClass::kState, StateKey(ns_, huge.tokens)));
}

// Item 3: a lookup finds the longest matching tail among many states at one
// node (hashing once per tail length present, not comparing every state):
// states that share a length but not the tokens, longer ones that do not
// match, and reserved ones never win.
TEST_F(CacheIndexTest, LookupPicksTheLongestMatchingTailAmongManyStates) {
  constexpr int32_t kWide = 64;
  const Hash128 ns = NamespaceKey("wide", "", "", "", kWide);
  const std::vector<TokenId> prompt = Tokens(kWide - 1, 0);
  auto put_state = [&](std::vector<TokenId> tail, bool commit) {
    PutSpec s;
    s.ns = ns;
    s.page_size = kWide;
    s.entry_class = EntryClass::kState;
    s.position = static_cast<int64_t>(tail.size());
    s.tokens = std::move(tail);
    s.size_bytes = 10;
    auto r = index_->Reserve(s, now_);
    ASSERT_TRUE(r.ok()) << r.status();
    if (commit) ASSERT_TRUE(index_->Commit(r->id, 1, now_).ok());
  };
  for (int len = 1; len < kWide; ++len) {
    for (int v = 0; v < 20; ++v) {  // 20 wrong tails of every length
      std::vector<TokenId> tail(prompt.begin(), prompt.begin() + len);
      tail.back() += 1000 + v;
      put_state(tail, true);
    }
  }
  put_state(std::vector<TokenId>(prompt.begin(), prompt.begin() + 40), true);   // wins
  put_state(std::vector<TokenId>(prompt.begin(), prompt.begin() + 17), true);   // shorter
  put_state(std::vector<TokenId>(prompt.begin(), prompt.begin() + 50), false);  // reserved only
  auto r = index_->Lookup(ns, kWide, {}, prompt, false, now_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resume_position, 40);
  ASSERT_TRUE(r->state.has_value());
  EXPECT_EQ(r->state->key, StateKey(ns, absl::MakeConstSpan(prompt).subspan(0, 40)));
  // A prompt shorter than the winner's tail falls back to the next one.
  std::vector<TokenId> shorter(prompt.begin(), prompt.begin() + 30);
  r = index_->Lookup(ns, kWide, {}, shorter, false, now_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->resume_position, 17);
}

// Item 10: a bad page size is refused by the rule it breaks, with the real
// limit (131072 is a power of two; it is too large).
TEST_F(CacheIndexTest, ABadPageSizeIsRefusedByTheRuleItBreaks) {
  PutSpec s = PageSpec(Tokens(4), 0);
  s.page_size = 131072;
  auto r = index_->Reserve(s, now_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "page_size 131072 is larger than the maximum, 65536");
  s.page_size = 12;
  EXPECT_EQ(index_->Reserve(s, now_).status().message(), "page_size 12 is not a power of two");
  s.page_size = 0;
  EXPECT_EQ(index_->Reserve(s, now_).status().message(), "page_size 0 must be positive");
  const std::vector<TokenId> t = Tokens(8);
  EXPECT_EQ(index_->Lookup(ns_, 131072, {}, t, false, now_).status().message(),
            "page_size 131072 is larger than the maximum, 65536");
}

// The class TTL expires idle states without walking past states that carry
// their own (session) TTL: those expire at their own time, before or after.
TEST_F(CacheIndexTest, ClassTtlAndSessionTtlStatesExpireEachAtTheirOwnTime) {
  CacheIndexOptions o = PayloadOnly();
  o.state_ttl = absl::Seconds(10);
  Make(o);
  PutSpec session = StateSpec(Tokens(3, 0), 3);
  session.ttl = absl::Seconds(100);
  PutCommitted(session);  // oldest in LRU order
  PutCommitted(StateSpec(Tokens(3, 50), 3));
  now_ += absl::Seconds(11);
  index_->Expire(now_);
  EXPECT_EQ(index_->Stats().states.entries, 1);
  EXPECT_EQ(index_->Stats().states.evicted_ttl, 1);
  EXPECT_EQ(Lookup(Tokens(3, 0)).resume_position, 3);  // the session state stayed (and was used now)
  now_ += absl::Seconds(101);
  index_->Expire(now_);
  EXPECT_EQ(index_->Stats().states.entries, 0);
}

}  // namespace
}  // namespace hybridserve::cachestore
