// One contract, four implementations: every test here runs against the gRPC
// GrpcCacheClient (a real server on loopback port 0), against the
// DirectReadCacheClient over it (the same server with its shared-memory socket
// on, then with its bulk port on), and against the InProcessCacheClient, each
// over a fresh CacheStore on a FakeClock.

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cachestore/testing/cache_client_test_harness.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

using common::WaitFor;

template <typename H>
class CacheClientContractTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(SmallOptions()); }

  void Restart(const CacheIndexOptions& options) {
    harness_ = std::make_unique<H>();
    absl::Status s = harness_->Start(options, clock_);
    ASSERT_TRUE(s.ok()) << s;
  }

  void TearDown() override { EXPECT_TRUE(harness_->store().CheckInvariants().ok()); }

  CacheClient& client() { return harness_->client(); }

  common::FakeClock clock_;
  std::unique_ptr<H> harness_;
  const ClientNamespace ns_ = kNamespace;
};

struct HarnessName {
  template <typename H>
  static std::string GetName(int) {
    return H::kName;
  }
};

using Implementations = ::testing::Types<GrpcHarness, ShmHarness, BulkHarness, InProcessHarness>;
TYPED_TEST_SUITE(CacheClientContractTest, Implementations, HarnessName);

TYPED_TEST(CacheClientContractTest, LookupOfAnUnknownPromptIsAMissWithoutLease) {
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, Tokens(40), LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resume_position, 0);
  EXPECT_EQ(r->kv_match_tokens, 0);
  EXPECT_TRUE(r->pages.empty());
  EXPECT_FALSE(r->state.has_value());
  EXPECT_EQ(r->lease_id, 0u);
}

TYPED_TEST(CacheClientContractTest, SessionRetentionIsGrantedReportedAndRefusedAsDocumented) {
  CacheIndexOptions o = SmallOptions();
  o.max_session_ttl = absl::Seconds(100);
  o.pin_quota_bytes = 1500;
  this->Restart(o);
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.tokens = Tokens(3);
  state.position = 3;
  state.ttl = absl::Seconds(30);
  state.pin = true;
  absl::StatusOr<PutResult> first = this->client().Put(this->ns_, state, Bytes(1000, 1));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->pinned);
  EXPECT_EQ(first->ttl, absl::Seconds(30));
  EXPECT_TRUE(first->pin_refused.empty());
  // Over the quota: stored, not pinned, and the reason says so; a TTL above
  // the maximum is capped.
  ClientPut second = state;
  second.tokens = Tokens(3, 50);
  second.ttl = absl::Hours(1);
  absl::StatusOr<PutResult> over = this->client().Put(this->ns_, second, Bytes(1000, 2));
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_FALSE(over->pinned);
  EXPECT_EQ(over->ttl, absl::Seconds(100));
  EXPECT_NE(over->pin_refused.find("pin quota"), std::string::npos) << over->pin_refused;
  absl::StatusOr<IndexStats> stats = this->client().Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pinned_states, 1);
  EXPECT_EQ(stats->pinned_bytes, 1000);
  // Retention is for states.
  ClientPut page;
  page.tokens = Tokens(kPageSize);
  page.pin = true;
  EXPECT_EQ(this->client().Put(this->ns_, page, Bytes(100, 3)).status().code(), absl::StatusCode::kInvalidArgument);
}

TYPED_TEST(CacheClientContractTest, PutPageThenLookupMatchesItsKvButHasNoResumePoint) {
  const std::vector<TokenId> t = Tokens(40);
  ClientPut page;
  page.tokens.assign(t.begin(), t.begin() + kPageSize);
  absl::StatusOr<PutResult> put = this->client().Put(this->ns_, page, Bytes(4096, 1));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->key, PageKeys(this->ns_.Key(), t, kPageSize)[0]);
  EXPECT_FALSE(put->already_present);

  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kv_match_tokens, 16);
  EXPECT_EQ(r->resume_position, 0);  // KV alone cannot be resumed from
  EXPECT_TRUE(r->pages.empty());
  EXPECT_FALSE(r->state.has_value());
  EXPECT_EQ(r->lease_id, 0u);

  absl::StatusOr<PutResult> again = this->client().Put(this->ns_, page, Bytes(4096, 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->key, put->key);
  EXPECT_TRUE(again->already_present);
}

TYPED_TEST(CacheClientContractTest, PutStateThenLookupResumesAtTheDeepestState) {
  const std::vector<TokenId> t = Tokens(40);
  const std::string grid = Bytes(3000, 2);
  const std::string exact = Bytes(5000, 3);
  std::vector<Hash128> keys = PutPrefix(this->client(), this->ns_, t, 16, StateKind::kGridCheckpoint, grid);
  PutPrefix(this->client(), this->ns_, t, 37, StateKind::kExactPrefix, exact);

  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resume_position, 37);
  EXPECT_EQ(r->kv_match_tokens, 32);
  ASSERT_EQ(r->pages.size(), 2u);
  EXPECT_EQ(r->pages[0].key, keys[0]);
  EXPECT_EQ(r->pages[0].entry_class, EntryClass::kPage);
  EXPECT_EQ(r->pages[0].position, 16);
  EXPECT_EQ(r->pages[1].key, keys[1]);
  EXPECT_EQ(r->pages[1].position, 32);
  // A page's size and checksum come with its bytes (the gRPC client leaves
  // them out of the lookup, so that its answer does not grow with the chain).
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::string> page = this->client().Get(r->lease_id, r->pages[i].key);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_EQ(page->size(), 1000u + i);
  }
  ASSERT_TRUE(r->state.has_value());
  EXPECT_EQ(r->state->key, StateKey(keys[1], {33, 34, 35, 36, 37}));
  EXPECT_EQ(r->state->entry_class, EntryClass::kState);
  EXPECT_EQ(r->state->state_kind, StateKind::kExactPrefix);
  EXPECT_EQ(r->state->position, 37);
  EXPECT_EQ(r->state->size_bytes, 5000);
  EXPECT_NE(r->lease_id, 0u);

  // A prompt that leaves the exact prefix before 37 resumes at the grid checkpoint.
  std::vector<TokenId> diverged = t;
  diverged[35] = 999;
  absl::StatusOr<LookupResult> g = this->client().Lookup(this->ns_, diverged, LookupMode::kLease);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->resume_position, 16);
  EXPECT_EQ(g->kv_match_tokens, 32);
  ASSERT_EQ(g->pages.size(), 1u);
  ASSERT_TRUE(g->state.has_value());
  EXPECT_EQ(g->state->key, StateKey(keys[0], {}));
  EXPECT_EQ(g->state->state_kind, StateKind::kGridCheckpoint);

  absl::StatusOr<IndexStats> stats = this->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages.entries, 2);
  EXPECT_EQ(stats->pages.resident_bytes, 2001);
  EXPECT_EQ(stats->states.entries, 2);
  EXPECT_EQ(stats->states.resident_bytes, 8000);
  EXPECT_EQ(stats->namespaces, 1);
  EXPECT_EQ(stats->active_leases, 2);
  EXPECT_EQ(stats->lookups, 2);
  EXPECT_EQ(stats->lookup_hits, 2);
  EXPECT_EQ(stats->hits_exact_prefix, 1);
  EXPECT_EQ(stats->hits_grid_checkpoint, 1);
}

TYPED_TEST(CacheClientContractTest, LeaseExpiryIsTheLeaseTimeAfterTheLookup) {
  const std::vector<TokenId> t = Tokens(20);
  PutPrefix(this->client(), this->ns_, t, 18, StateKind::kExactPrefix, Bytes(500, 4));
  const absl::Time before = this->harness_->LeaseClockNow();
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  const absl::Time after = this->harness_->LeaseClockNow();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE(r->lease_id, 0u);
  EXPECT_GE(r->lease_expiry, before + absl::Milliseconds(5500));
  EXPECT_LE(r->lease_expiry, after + absl::Milliseconds(5500));
}

TYPED_TEST(CacheClientContractTest, ProbeOnlyLookupReportsTheMatchWithoutLease) {
  const std::vector<TokenId> t = Tokens(40);
  PutPrefix(this->client(), this->ns_, t, 37, StateKind::kExactPrefix, Bytes(5000, 3));
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kProbeOnly);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resume_position, 37);
  EXPECT_EQ(r->lease_id, 0u);
  absl::StatusOr<IndexStats> stats = this->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->active_leases, 0);
}

TYPED_TEST(CacheClientContractTest, GetReturnsTheExactBytesThatWerePut) {
  const std::vector<TokenId> t = Tokens(40);
  // 300007 bytes: several 64 KiB chunks over gRPC, and not a multiple of one.
  const std::string state = Bytes(300007, 9);
  std::vector<Hash128> keys = PutPrefix(this->client(), this->ns_, t, 37, StateKind::kExactPrefix, state);
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->state.has_value());

  absl::StatusOr<std::string> got = this->client().Get(r->lease_id, r->state->key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == state);
  // GetInto replaces whatever the buffer held.
  std::string buffer = "stale bytes from an earlier entry";
  ASSERT_TRUE(this->client().GetInto(r->lease_id, keys[1], &buffer).ok());
  EXPECT_EQ(buffer, Bytes(1001, 101));
  ASSERT_TRUE(this->client().GetInto(r->lease_id, keys[0], &buffer).ok());
  EXPECT_EQ(buffer, Bytes(1000, 100));
}

TYPED_TEST(CacheClientContractTest, GetManyReturnsEachEntryAsGetDoes) {
  const std::vector<TokenId> t = Tokens(40);
  const std::string state = Bytes(300007, 9);  // several gRPC chunks, not a multiple of one
  std::vector<Hash128> keys = PutPrefix(this->client(), this->ns_, t, 37, StateKind::kExactPrefix, state);
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->state.has_value());
  // Pages, the state and a page again, into buffers holding stale bytes.
  const std::vector<Hash128> many = {keys[0], keys[1], r->state->key, keys[0]};
  std::vector<std::string> out = {"stale", "", std::string(10, 'x'), "y"};
  ASSERT_TRUE(this->client().GetManyInto(r->lease_id, many, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out[0], Bytes(1000, 100));
  EXPECT_EQ(out[1], Bytes(1001, 101));
  EXPECT_TRUE(out[2] == state);
  EXPECT_EQ(out[3], Bytes(1000, 100));
}

// A model without attention layers has pages of no bytes: they chain the
// prefix for its states. They are stored, looked up, leased and read like any
// page (Get and GetMany, between entries with bytes); a state of no bytes is
// refused.
TYPED_TEST(CacheClientContractTest, EmptyPagesChainTheStatesOfAModelWithoutAttention) {
  const std::vector<TokenId> t = Tokens(40);
  std::vector<Hash128> keys;
  for (int i = 0; i < 2; ++i) {
    ClientPut page;
    if (i > 0) page.parent = keys.back();
    page.tokens.assign(t.begin() + i * kPageSize, t.begin() + (i + 1) * kPageSize);
    absl::StatusOr<PutResult> r = this->client().Put(this->ns_, page, "");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->already_present);
    keys.push_back(r->key);
  }
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.parent = keys[1];
  state.tokens.assign(t.begin() + 32, t.begin() + 37);
  state.position = 37;
  absl::StatusOr<PutResult> refused = this->client().Put(this->ns_, state, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "must be > 0")) << refused.status();
  const std::string state_bytes = Bytes(700, 5);
  ASSERT_TRUE(this->client().Put(this->ns_, state, state_bytes).ok());

  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resume_position, 37);
  EXPECT_EQ(r->kv_match_tokens, 32);
  ASSERT_EQ(r->pages.size(), 2u);
  ASSERT_TRUE(r->state.has_value());
  std::string buffer = "stale";
  ASSERT_TRUE(this->client().GetInto(r->lease_id, keys[1], &buffer).ok());
  EXPECT_EQ(buffer, "");
  const std::vector<Hash128> many = {keys[0], r->state->key, keys[1]};
  std::vector<std::string> out = {"x", "", "y"};
  ASSERT_TRUE(this->client().GetManyInto(r->lease_id, many, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out[0], "");
  EXPECT_EQ(out[1], state_bytes);
  EXPECT_EQ(out[2], "");
  EXPECT_TRUE(this->client().Release(r->lease_id).ok());
  absl::StatusOr<IndexStats> stats = this->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages.entries, 2);
  EXPECT_EQ(stats->pages.resident_bytes, 0);
}

TYPED_TEST(CacheClientContractTest, GetManyFailsOnTheFirstKeyTheLeaseCannotServeAndNamesIt) {
  const std::vector<TokenId> t = Tokens(40);
  std::vector<Hash128> keys = PutPrefix(this->client(), this->ns_, t, 37, StateKind::kExactPrefix, Bytes(5000, 3));
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> out(3);
  const std::vector<Hash128> with_stranger = {keys[0], Hash128{1, 2}, keys[1]};
  absl::Status s = this->client().GetManyInto(r->lease_id, with_stranger, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "keys[1]")) << s;
  const std::vector<Hash128> mine = {keys[0], keys[1], r->state->key};
  EXPECT_EQ(this->client().GetManyInto(r->lease_id + 1000, mine, absl::MakeSpan(out)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(this->client().GetManyInto(r->lease_id, {}, {}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::string> too_few(2);
  EXPECT_EQ(this->client().GetManyInto(r->lease_id, mine, absl::MakeSpan(too_few)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(this->client().GetManyInto(r->lease_id, mine, absl::MakeSpan(out)).ok());  // the lease still serves
}

// Buffers for `sizes` bytes, each cut into segments of 1, 0 and 7 bytes and
// the rest (as a page's K and V regions are), filled with 0x5a.
struct Scattered {
  std::vector<std::string> buffers;
  std::vector<EntrySegments> destinations;

  explicit Scattered(const std::vector<size_t>& sizes) : buffers(sizes.size()), destinations(sizes.size()) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      buffers[i].assign(sizes[i], '\x5a');
      char* p = buffers[i].data();
      size_t left = sizes[i];
      for (size_t cut : {size_t{1}, size_t{0}, size_t{7}, sizes[i]}) {
        const size_t n = std::min(cut, left);
        destinations[i].segments.push_back(absl::MakeSpan(p, n));
        p += n;
        left -= n;
      }
    }
  }
};

TYPED_TEST(CacheClientContractTest, GetManyScatteredFillsEachEntrysSegmentsInOrder) {
  const std::vector<TokenId> t = Tokens(40);
  std::vector<Hash128> keys = PutPrefix(this->client(), this->ns_, t, 37, StateKind::kExactPrefix, Bytes(5000, 3));
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<Hash128> mine = {keys[1], r->state->key, keys[0]};
  std::vector<std::string> want(3);
  ASSERT_TRUE(this->client().GetManyInto(r->lease_id, mine, absl::MakeSpan(want)).ok());
  Scattered got({want[0].size(), want[1].size(), want[2].size()});
  ASSERT_TRUE(this->client().GetManyScattered(r->lease_id, mine, got.destinations).ok());
  EXPECT_EQ(got.buffers, want);
  EXPECT_EQ(want[1], Bytes(5000, 3));

  // A destination of another size is refused by name, as a stranger key is.
  Scattered short_one({want[0].size(), want[1].size() - 1, want[2].size()});
  absl::Status s = this->client().GetManyScattered(r->lease_id, mine, short_one.destinations);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "keys[1]")) << s;
  const std::vector<Hash128> with_stranger = {keys[0], Hash128{1, 2}, keys[1]};
  Scattered for_stranger({want[2].size(), 1, want[0].size()});
  s = this->client().GetManyScattered(r->lease_id, with_stranger, for_stranger.destinations);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "keys[1]")) << s;
  EXPECT_EQ(this->client().GetManyScattered(r->lease_id + 1000, mine, got.destinations).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(this->client().GetManyScattered(r->lease_id, {}, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(this->client().GetManyScattered(r->lease_id, mine, absl::MakeConstSpan(got.destinations).subspan(1)).code(),
            absl::StatusCode::kInvalidArgument);
  Scattered again({want[0].size(), want[1].size(), want[2].size()});
  ASSERT_TRUE(this->client().GetManyScattered(r->lease_id, mine, again.destinations).ok());  // the lease still serves
  EXPECT_EQ(again.buffers, want);
}

TYPED_TEST(CacheClientContractTest, GetOfAnEntryNotHeldByTheLeaseIsNotFound) {
  const std::vector<TokenId> t = Tokens(40);
  PutPrefix(this->client(), this->ns_, t, 37, StateKind::kExactPrefix, Bytes(5000, 3));
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE(r->lease_id, 0u);

  EXPECT_EQ(this->client().Get(r->lease_id + 1000, r->state->key).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(this->client().Get(r->lease_id, Hash128{1, 2}).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(this->client().Release(r->lease_id).ok());
  EXPECT_EQ(this->client().Get(r->lease_id, r->state->key).status().code(), absl::StatusCode::kNotFound);
}

TYPED_TEST(CacheClientContractTest, GetAfterTheLeaseExpiredIsNotFound) {
  const std::vector<TokenId> t = Tokens(40);
  PutPrefix(this->client(), this->ns_, t, 37, StateKind::kExactPrefix, Bytes(5000, 3));
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  this->clock_.Advance(absl::Seconds(4));
  EXPECT_TRUE(this->client().Get(r->lease_id, r->state->key).ok());  // a read extends the lease by 5.5 s
  this->clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(this->client().Get(r->lease_id, r->state->key).status().code(), absl::StatusCode::kNotFound);
}

TYPED_TEST(CacheClientContractTest, ReleaseOfAnUnknownLeaseIsNotFound) {
  EXPECT_EQ(this->client().Release(424242).code(), absl::StatusCode::kNotFound);
  const std::vector<TokenId> t = Tokens(20);
  PutPrefix(this->client(), this->ns_, t, 18, StateKind::kExactPrefix, Bytes(500, 4));
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(this->client().Release(r->lease_id).ok());
  EXPECT_EQ(this->client().Release(r->lease_id).code(), absl::StatusCode::kNotFound);
}

TYPED_TEST(CacheClientContractTest, NamespaceWithABadPageSizeOrNoFingerprintIsInvalidArgument) {
  ClientPut page;
  page.tokens = Tokens(kPageSize);
  for (int32_t page_size : {0, -16, 6, 12, 1 << 17}) {
    ClientNamespace bad = this->ns_;
    bad.page_size = page_size;
    EXPECT_EQ(this->client().Lookup(bad, Tokens(64), LookupMode::kLease).status().code(),
              absl::StatusCode::kInvalidArgument)
        << page_size;
    EXPECT_EQ(this->client().Put(bad, page, Bytes(100, 1)).status().code(), absl::StatusCode::kInvalidArgument)
        << page_size;
  }
  ClientNamespace anonymous = this->ns_;
  anonymous.model_fingerprint.clear();
  EXPECT_EQ(this->client().Lookup(anonymous, Tokens(64), LookupMode::kLease).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(this->client().Put(anonymous, page, Bytes(100, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  // The largest valid page size is accepted.
  ClientNamespace largest = this->ns_;
  largest.page_size = 1 << 16;
  EXPECT_TRUE(this->client().Lookup(largest, Tokens(64), LookupMode::kLease).ok());
  absl::StatusOr<IndexStats> stats = this->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages.entries + stats->states.entries, 0);
}

TYPED_TEST(CacheClientContractTest, PutsRegisterTheirNamespacesModelCostWhichIsNotPartOfItsKey) {
  // An old client's puts carry none: the namespace uses the fallback.
  const std::vector<TokenId> t = Tokens(2 * kPageSize + 3);
  PutPrefix(this->client(), this->ns_, t, 2 * kPageSize + 3, StateKind::kExactPrefix, Bytes(500, 9));
  absl::StatusOr<IndexStats> stats = this->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->namespaces, 1);
  EXPECT_EQ(stats->namespaces_with_model_cost, 0);

  // The same namespace with a cost: same key, same entries; a put (of a page
  // already present, and by PutMany) registers the cost.
  ClientNamespace costed = this->ns_;
  costed.model_cost = PrefillCost{2188288, 1024};
  ASSERT_EQ(costed.Key(), this->ns_.Key());
  absl::StatusOr<LookupResult> hit = this->client().Lookup(costed, t, LookupMode::kProbeOnly);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->resume_position, 2 * kPageSize + 3);
  const std::vector<ClientPut> pages = PageChain(t, 1);
  const std::string bytes = Bytes(1000, 100);
  const PutManyEntry entry{&pages[0], bytes, std::nullopt};
  const std::vector<absl::StatusOr<PutResult>> put = this->client().PutMany(costed, {entry});
  ASSERT_EQ(put.size(), 1u);
  ASSERT_TRUE(put[0].ok()) << put[0].status();
  EXPECT_TRUE(put[0]->already_present);
  stats = this->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->namespaces, 1);
  EXPECT_EQ(stats->namespaces_with_model_cost, 1);

  // A value that is not a finite number in [0, 1e30] is refused naming the field.
  for (const PrefillCost& bad : {PrefillCost{-1, 0}, PrefillCost{std::nan(""), 0},
                                 PrefillCost{1, std::numeric_limits<double>::infinity()}, PrefillCost{1, 2e30}}) {
    ClientNamespace wrong = this->ns_;
    wrong.model_cost = bad;
    const std::string field = std::isfinite(bad.flops_per_token) && bad.flops_per_token >= 0
                                  ? "namespace.model_cost.flops_per_token_context"
                                  : "namespace.model_cost.flops_per_token ";
    const absl::Status put_status = this->client().Put(wrong, pages[0], bytes).status();
    EXPECT_EQ(put_status.code(), absl::StatusCode::kInvalidArgument) << put_status;
    EXPECT_NE(put_status.message().find(field), absl::string_view::npos) << put_status;
    const absl::Status lookup_status = this->client().Lookup(wrong, t, LookupMode::kProbeOnly).status();
    EXPECT_EQ(lookup_status.code(), absl::StatusCode::kInvalidArgument) << lookup_status;
    EXPECT_NE(lookup_status.message().find(field), absl::string_view::npos) << lookup_status;
  }
}

TYPED_TEST(CacheClientContractTest, MalformedCallsGetTheDocumentedCodes) {
  const ClientNamespace& ns = this->ns_;
  CacheClient& client = this->client();
  EXPECT_EQ(client.Lookup(ns, {1, -2}, LookupMode::kLease).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.Lookup(ns, Tokens(4097), LookupMode::kLease).status().code(), absl::StatusCode::kInvalidArgument);

  ClientPut page;
  page.tokens = Tokens(kPageSize);
  ClientPut empty_state;
  empty_state.entry_class = EntryClass::kState;
  empty_state.tokens = {1, 2};
  empty_state.position = 2;
  EXPECT_EQ(client.Put(ns, empty_state, "").status().code(), absl::StatusCode::kInvalidArgument);
  ClientPut short_page;
  short_page.tokens = Tokens(kPageSize - 1);
  EXPECT_EQ(client.Put(ns, short_page, Bytes(100, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  ClientPut orphan = page;
  orphan.parent = Hash128{5, 6};
  EXPECT_EQ(client.Put(ns, orphan, Bytes(100, 1)).status().code(), absl::StatusCode::kFailedPrecondition);
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.tokens = {1, 2};
  state.position = 3;  // disagrees with a 2-token tail at the root
  EXPECT_EQ(client.Put(ns, state, Bytes(100, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  state.position = 2;
  EXPECT_EQ(client.Put(ns, state, Bytes((1 << 20) + 1, 1)).status().code(), absl::StatusCode::kResourceExhausted);

  absl::StatusOr<IndexStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages.entries + stats->states.entries, 0);
  EXPECT_EQ(stats->pages.reserved_bytes + stats->states.reserved_bytes, 0);
}

TYPED_TEST(CacheClientContractTest, PinnedStateHoldsItsBudgetAgainstANewPut) {
  const std::vector<TokenId> t = Tokens(20);
  PutPrefix(this->client(), this->ns_, t, 18, StateKind::kExactPrefix, Bytes(600 << 10, 4));
  absl::StatusOr<LookupResult> r = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  ClientPut other;
  other.entry_class = EntryClass::kState;
  other.tokens = {9, 9};
  other.position = 2;
  EXPECT_EQ(this->client().Put(this->ns_, other, Bytes(600 << 10, 5)).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(this->client().Release(r->lease_id).ok());
  EXPECT_TRUE(this->client().Put(this->ns_, other, Bytes(600 << 10, 5)).ok());  // evicts the unpinned one
}

TYPED_TEST(CacheClientContractTest, PutManyStoresAChainWhoseEntriesHangFromTheOnesBefore) {
  const std::vector<TokenId> t = Tokens(8 * kPageSize + 5);
  std::vector<ClientPut> puts = PageChain(t, 8);
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.parent = PageKeys(this->ns_.Key(), t, kPageSize)[7];
  state.tokens.assign(t.begin() + 8 * kPageSize, t.end());
  state.position = static_cast<int64_t>(t.size());
  puts.push_back(state);
  // 100003-byte pages: several 64 KiB chunks over gRPC, not a multiple of one.
  std::vector<std::string> bytes;
  for (int i = 0; i < 9; ++i) bytes.push_back(Bytes(i == 8 ? 3000 : 100003, 40 + i));
  std::vector<PutManyEntry> entries;
  for (int i = 0; i < 9; ++i) entries.push_back({&puts[i], bytes[i]});
  std::vector<absl::StatusOr<PutResult>> r = this->client().PutMany(this->ns_, entries);
  ASSERT_EQ(r.size(), 9u);
  const std::vector<Hash128> keys = PageKeys(this->ns_.Key(), t, kPageSize);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(r[i].ok()) << i << ": " << r[i].status();
    EXPECT_EQ(r[i]->key, keys[i]);
    EXPECT_FALSE(r[i]->already_present);
  }
  ASSERT_TRUE(r[8].ok()) << r[8].status();
  EXPECT_EQ(r[8]->key, StateKey(keys[7], state.tokens));

  absl::StatusOr<LookupResult> hit = this->client().Lookup(this->ns_, t, LookupMode::kLease);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->resume_position, static_cast<int64_t>(t.size()));
  std::vector<std::string> out(8);
  ASSERT_TRUE(this->client().GetManyInto(hit->lease_id, keys, absl::MakeSpan(out)).ok());
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(out[i] == bytes[i]) << i;
  EXPECT_TRUE(this->client().Get(hit->lease_id, hit->state->key).value() == bytes[8]);
  EXPECT_TRUE(this->client().PutMany(this->ns_, {}).empty());
}

TYPED_TEST(CacheClientContractTest, PutManyAnswersEachEntryAndARefusalStopsNoOther) {
  const std::vector<TokenId> t = Tokens(3 * kPageSize);
  std::vector<ClientPut> chain = PageChain(t, 3);
  ASSERT_TRUE(this->client().Put(this->ns_, chain[0], Bytes(5000, 1)).ok());
  ClientPut orphan = chain[1];
  orphan.parent = Hash128{5, 6};
  ClientPut too_large;  // over the 1 MiB state budget
  too_large.entry_class = EntryClass::kState;
  too_large.tokens = {1, 2};
  too_large.position = 2;
  ClientPut short_page;
  short_page.tokens = Tokens(kPageSize - 1);
  const std::string page_bytes = Bytes(70000, 2), big = Bytes((1 << 20) + 1, 3);
  const std::vector<PutManyEntry> entries = {
      {&chain[0], page_bytes},    // already present: its bytes are never looked at
      {&orphan, page_bytes},      // FAILED_PRECONDITION
      {&too_large, big},          // RESOURCE_EXHAUSTED
      {&short_page, page_bytes},  // INVALID_ARGUMENT
      {&chain[1], page_bytes},    // created, under the present page 0
      {&chain[2], page_bytes},    // created, under the entry before it
  };
  std::vector<absl::StatusOr<PutResult>> r = this->client().PutMany(this->ns_, entries);
  ASSERT_EQ(r.size(), entries.size());
  ASSERT_TRUE(r[0].ok()) << r[0].status();
  EXPECT_TRUE(r[0]->already_present);
  EXPECT_EQ(r[1].status().code(), absl::StatusCode::kFailedPrecondition) << r[1].status();
  EXPECT_EQ(r[2].status().code(), absl::StatusCode::kResourceExhausted) << r[2].status();
  EXPECT_EQ(r[3].status().code(), absl::StatusCode::kInvalidArgument) << r[3].status();
  for (int i : {4, 5}) {
    ASSERT_TRUE(r[i].ok()) << i << ": " << r[i].status();
    EXPECT_FALSE(r[i]->already_present);
  }
  absl::StatusOr<IndexStats> stats = this->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages.entries, 3);
  EXPECT_EQ(stats->pages.resident_bytes, 5000 + 2 * 70000);
  EXPECT_EQ(stats->states.entries, 0);
  EXPECT_EQ(stats->pages.reserved_bytes + stats->states.reserved_bytes, 0);
}

TYPED_TEST(CacheClientContractTest, PutManyChecksumMismatchIsDataLossForThatEntryAndCommitsNothingOfIt) {
  const std::vector<TokenId> t = Tokens(3 * kPageSize);
  std::vector<ClientPut> chain = PageChain(t, 3);
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.tokens = {1, 2, 3};
  state.position = 3;
  const std::string a = Bytes(70000, 1), b = Bytes(70000, 2), c = Bytes(70000, 3), d = Bytes(900, 4);
  const uint64_t wrong = common::Checksum64(b.data(), b.size()) ^ 1;
  const std::vector<PutManyEntry> entries = {
      {&chain[0], a, common::Checksum64(a.data(), a.size())},  // the caller's checksum, right
      {&chain[1], b, wrong},                                   // DATA_LOSS
      {&chain[2], c},                                          // its parent never came
      {&state, d},
  };
  std::vector<absl::StatusOr<PutResult>> r = this->client().PutMany(this->ns_, entries);
  ASSERT_EQ(r.size(), entries.size());
  EXPECT_TRUE(r[0].ok()) << r[0].status();
  EXPECT_EQ(r[1].status().code(), absl::StatusCode::kDataLoss) << r[1].status();
  EXPECT_EQ(r[2].status().code(), absl::StatusCode::kFailedPrecondition) << r[2].status();
  EXPECT_TRUE(r[3].ok()) << r[3].status();
  absl::StatusOr<LookupResult> probe = this->client().Lookup(this->ns_, t, LookupMode::kProbeOnly);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->kv_match_tokens, kPageSize);
  absl::StatusOr<IndexStats> stats = this->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages.entries, 1);
  EXPECT_EQ(stats->states.entries, 1);
  EXPECT_EQ(stats->pages.reserved_bytes + stats->states.reserved_bytes, 0);
}

}  // namespace
}  // namespace hybridserve::cachestore
