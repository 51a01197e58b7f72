// ShardedCacheClient over three real cachestore servers on loopback, each
// reached by its own GrpcCacheClient: placement by chain, lease routing, a
// stopped shard failing fast and its chains re-homed, the shard's return on
// the same port, Stats summed, and the inputs refused.

#include "cachestore/client/sharded_cache_client.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachestore/client/shard_placement.h"
#include "cachestore/testing/cache_client_test_harness.h"
#include "common/wait_for.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

using common::WaitFor;
using ::testing::HasSubstr;

constexpr int kShards = 3;

class ShardedCacheClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<CacheShard> shards;
    for (int i = 0; i < kShards; ++i) {
      ASSERT_TRUE(StartServer(i, 0).ok());
      ports_.push_back(servers_[i]->port());
      names_.push_back(absl::StrCat("127.0.0.1:", ports_[i]));
      GrpcCacheClientOptions o;
      o.timeout = absl::Seconds(30);  // never reached: a stopped server refuses at once
      o.max_reconnect_backoff = absl::Milliseconds(100);
      absl::StatusOr<std::unique_ptr<GrpcCacheClient>> c = GrpcCacheClient::Create(names_[i], o);
      ASSERT_TRUE(c.ok()) << c.status();
      shards.push_back(CacheShard{names_[i], names_[i], std::shared_ptr<CacheClient>(*std::move(c)), nullptr});
    }
    ShardedCacheClientOptions o;
    o.probe_interval = absl::Milliseconds(20);
    absl::StatusOr<std::unique_ptr<ShardedCacheClient>> client = ShardedCacheClient::Create(std::move(shards), o);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    absl::StatusOr<ShardPlacement> p = ShardPlacement::Create(names_);
    ASSERT_TRUE(p.ok());
    placement_ = std::make_unique<ShardPlacement>(*std::move(p));
  }

  void TearDown() override { client_.reset(); }

  // Server i, on `port` (0: a free one).
  absl::Status StartServer(int i, int port) {
    ServerOptions o;
    o.address = absl::StrCat("127.0.0.1:", port);
    o.index = SmallOptions();
    o.reap_interval = absl::Hours(1);
    o.service.shard_name = absl::StrCat("shard-", i);
    absl::StatusOr<std::unique_ptr<CacheStoreServer>> s = CacheStoreServer::Start(o, clock_, registry_);
    if (!s.ok()) return s.status();
    if (static_cast<int>(servers_.size()) <= i) servers_.resize(i + 1);
    servers_[i] = *std::move(s);
    return absl::OkStatus();
  }
  void StopServer(int i) {
    servers_[i]->Shutdown(absl::ZeroDuration());
    servers_[i]->Wait();
    servers_[i].reset();
  }

  int IndexOf(absl::string_view name) const {
    for (int i = 0; i < kShards; ++i) {
      if (names_[i] == name) return i;
    }
    ADD_FAILURE() << name;
    return 0;
  }
  // The prompt of conversation c: three pages and a half, its own first page.
  static std::vector<TokenId> Prompt(int c) { return Tokens(3 * kPageSize + 8, 1000 * c + 1); }
  static ClientNamespace PlacedNamespace(const std::vector<TokenId>& tokens) {
    ClientNamespace ns = kNamespace;
    ns.placement = ChainKeyOf(ns, tokens);
    return ns;
  }
  int OwnerIndex(const std::vector<TokenId>& tokens) const {
    return IndexOf(placement_->Owner(kNamespace.Key(), ChainKeyOf(kNamespace, tokens)));
  }
  int RankedIndex(const std::vector<TokenId>& tokens, int rank) const {
    return IndexOf(placement_->Ranked(kNamespace.Key(), ChainKeyOf(kNamespace, tokens))[rank]);
  }
  ShardCounts CountsOf(int i) const {
    for (const ShardCounts& c : client_->counts()) {
      if (c.name == names_[i]) return c;
    }
    ADD_FAILURE() << names_[i];
    return {};
  }
  int64_t EntriesOn(int i) {
    const IndexStats s = servers_[i]->store().Stats();
    return s.pages.entries + s.states.entries;
  }

  common::FakeClock clock_;
  prometheus::Registry registry_;
  std::vector<std::unique_ptr<CacheStoreServer>> servers_;
  std::vector<int> ports_;
  std::vector<std::string> names_;
  std::unique_ptr<ShardPlacement> placement_;
  std::unique_ptr<ShardedCacheClient> client_;
};

TEST_F(ShardedCacheClientTest, EveryEntryOfAChainIsOnItsOwnerAndALookupIsOneCallToIt) {
  std::vector<int> owned(kShards, 0);
  constexpr int kChains = 24;
  for (int c = 0; c < kChains; ++c) {
    const std::vector<TokenId> t = Prompt(c);
    const int owner = OwnerIndex(t);
    std::vector<int64_t> before(kShards);
    for (int i = 0; i < kShards; ++i) before[i] = EntriesOn(i);
    PutPrefix(*client_, PlacedNamespace(t), t, static_cast<int64_t>(t.size()), StateKind::kExactPrefix, Bytes(500, c));
    // Three pages and the state, all on the owner, none elsewhere.
    for (int i = 0; i < kShards; ++i) EXPECT_EQ(EntriesOn(i) - before[i], i == owner ? 4 : 0) << c << " " << i;
    ++owned[owner];
  }
  for (int i = 0; i < kShards; ++i) EXPECT_GT(owned[i], 0) << "no chain placed on shard " << i;
  // A lookup (any namespace placement: Lookup places by its tokens) is one
  // call to the owner, and finds everything.
  for (int c = 0; c < kChains; ++c) {
    const std::vector<TokenId> t = Prompt(c);
    std::vector<int64_t> lookups(kShards);
    for (int i = 0; i < kShards; ++i) lookups[i] = servers_[i]->store().Stats().lookups;
    absl::StatusOr<LookupResult> r = client_->Lookup(kNamespace, t, LookupMode::kProbeOnly);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->resume_position, static_cast<int64_t>(t.size()));
    EXPECT_EQ(r->pages.size(), 3u);
    for (int i = 0; i < kShards; ++i) {
      EXPECT_EQ(servers_[i]->store().Stats().lookups - lookups[i], i == OwnerIndex(t) ? 1 : 0) << c << " " << i;
    }
  }
}

TEST_F(ShardedCacheClientTest, WithoutAPlacementARootEntryIsPlacedByItsOwnChainAndAChildIsRefused) {
  const std::vector<TokenId> t = Prompt(7);
  const std::vector<ClientPut> chain = PageChain(t, 2);
  const int owner = OwnerIndex(t);
  // PutMany: the root page places the call; the page hanging from it follows.
  const std::string b0 = Bytes(300, 1), b1 = Bytes(300, 2);
  const PutManyEntry entries[] = {{&chain[0], b0, std::nullopt}, {&chain[1], b1, std::nullopt}};
  for (const absl::StatusOr<PutResult>& r : client_->PutMany(kNamespace, entries)) EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(servers_[owner]->store().Stats().pages.entries, 2);
  // A lone page with a parent names no chain.
  absl::StatusOr<PutResult> child = client_->Put(kNamespace, chain[1], b1);
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(child.status().message(), HasSubstr("placement"));
  // A state with no parent is placed by N.
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.tokens = Tokens(5);
  state.position = 5;
  ASSERT_TRUE(client_->Put(kNamespace, state, Bytes(100, 3)).ok());
  const int n_owner = IndexOf(placement_->Owner(kNamespace.Key(), kNamespace.Key()));
  EXPECT_EQ(servers_[n_owner]->store().Stats().states.entries, 1);
  // Root entries of two chains in one PutMany cannot be placed together.
  const std::vector<ClientPut> other = PageChain(Prompt(8), 1);
  const PutManyEntry mixed[] = {{&chain[0], b0, std::nullopt}, {&other[0], b1, std::nullopt}};
  for (const absl::StatusOr<PutResult>& r : client_->PutMany(kNamespace, mixed)) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("placement"));
  }
  // A bad namespace is refused before any call.
  ClientNamespace bad = kNamespace;
  bad.page_size = 3;
  EXPECT_EQ(client_->Lookup(bad, t, LookupMode::kProbeOnly).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardedCacheClientTest, LeasesGoToTheShardThatGrantedThem) {
  for (int c = 0; c < 6; ++c) {
    const std::vector<TokenId> t = Prompt(c);
    const std::vector<Hash128> keys = PutPrefix(*client_, PlacedNamespace(t), t, static_cast<int64_t>(t.size()),
                                                StateKind::kExactPrefix, Bytes(500, c));
    absl::StatusOr<LookupResult> r = client_->Lookup(kNamespace, t, LookupMode::kLease);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_NE(r->lease_id, 0u);
    EXPECT_NE(r->lease_id >> ShardedCacheClient::kSlotShift, 0u);
    EXPECT_EQ(servers_[OwnerIndex(t)]->store().Stats().active_leases, 1);
    absl::StatusOr<std::string> state = client_->Get(r->lease_id, r->state->key);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(*state, Bytes(500, c));
    std::vector<std::string> pages(3);
    ASSERT_TRUE(client_->GetManyInto(r->lease_id, {keys[0], keys[1], keys[2]}, absl::MakeSpan(pages)).ok());
    EXPECT_EQ(pages[2], Bytes(1002, 102));
    // The shard's own id alone is another shard's slot 0: no shard.
    EXPECT_EQ(client_->Release(r->lease_id & ShardedCacheClient::kShardLeaseMask).code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(client_->Release(r->lease_id).ok());
    EXPECT_EQ(client_->Release(r->lease_id).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(servers_[OwnerIndex(t)]->store().Stats().active_leases, 0);
  }
}

TEST_F(ShardedCacheClientTest, AStoppedShardFailsFastItsChainsMoveToTheNextShardAndReturnWhenItRestarts) {
  const std::vector<TokenId> t = Prompt(3);
  const int owner = OwnerIndex(t);
  const int second = RankedIndex(t, 1);
  PutPrefix(*client_, PlacedNamespace(t), t, static_cast<int64_t>(t.size()), StateKind::kExactPrefix, Bytes(500, 1));
  absl::StatusOr<LookupResult> held = client_->Lookup(kNamespace, t, LookupMode::kLease);
  ASSERT_TRUE(held.ok() && held->lease_id != 0) << held.status();

  StopServer(owner);
  // The first call finds it gone, and marks it down.
  absl::StatusOr<LookupResult> first = client_->Lookup(kNamespace, t, LookupMode::kProbeOnly);
  EXPECT_EQ(first.status().code(), absl::StatusCode::kUnavailable) << first.status();
  EXPECT_FALSE(CountsOf(owner).up);
  EXPECT_EQ(CountsOf(owner).failures, 1);
  const int64_t calls_to_owner = CountsOf(owner).calls;
  // From now on no call is sent to it: lookups miss on the next shard, the
  // lease it granted answers at once, and the re-publication lands on the
  // next shard, which then hits.
  EXPECT_EQ(*client_->OwnerOf(kNamespace.Key(), ChainKeyOf(kNamespace, t)), names_[second]);
  absl::StatusOr<LookupResult> miss = client_->Lookup(kNamespace, t, LookupMode::kProbeOnly);
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(miss->resume_position, 0);
  std::string out;
  EXPECT_EQ(client_->GetInto(held->lease_id, held->state->key, &out).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client_->Release(held->lease_id).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CountsOf(owner).refused, 2);
  PutPrefix(*client_, PlacedNamespace(t), t, static_cast<int64_t>(t.size()), StateKind::kExactPrefix, Bytes(500, 2));
  EXPECT_EQ(EntriesOn(second), 4);
  absl::StatusOr<LookupResult> hit = client_->Lookup(kNamespace, t, LookupMode::kLease);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->resume_position, static_cast<int64_t>(t.size()));
  EXPECT_EQ(*client_->Get(hit->lease_id, hit->state->key), Bytes(500, 2));
  EXPECT_TRUE(client_->Release(hit->lease_id).ok());
  EXPECT_EQ(CountsOf(owner).calls, calls_to_owner);
  EXPECT_EQ(client_->Stats().status().code(), absl::StatusCode::kUnavailable);

  // Back on the same port (empty): the prober sees it, and its chains return.
  ASSERT_TRUE(StartServer(owner, ports_[owner]).ok());
  ASSERT_TRUE(WaitFor([&] { return CountsOf(owner).up; }));
  EXPECT_EQ(*client_->OwnerOf(kNamespace.Key(), ChainKeyOf(kNamespace, t)), names_[owner]);
  absl::StatusOr<LookupResult> again = client_->Lookup(kNamespace, t, LookupMode::kProbeOnly);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->resume_position, 0);  // a restarted shard without a disk tier is empty
  EXPECT_EQ(CountsOf(owner).calls, calls_to_owner + 1);
  PutPrefix(*client_, PlacedNamespace(t), t, static_cast<int64_t>(t.size()), StateKind::kExactPrefix, Bytes(500, 3));
  EXPECT_EQ(EntriesOn(owner), 4);
  EXPECT_EQ(client_->Lookup(kNamespace, t, LookupMode::kProbeOnly)->resume_position, static_cast<int64_t>(t.size()));
}

TEST_F(ShardedCacheClientTest, WithEveryShardDownEveryCallIsAMissAtOnce) {
  for (int i = 0; i < kShards; ++i) StopServer(i);
  const std::vector<TokenId> t = Prompt(1);
  // Each call finds one more shard down, until none is left.
  for (int i = 0; i < kShards; ++i) {
    EXPECT_EQ(client_->Lookup(kNamespace, t, LookupMode::kProbeOnly).status().code(), absl::StatusCode::kUnavailable);
  }
  absl::StatusOr<LookupResult> none = client_->Lookup(kNamespace, t, LookupMode::kProbeOnly);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(), HasSubstr("no cachestore shard is up"));
  int64_t calls = 0;
  for (const ShardCounts& c : client_->counts()) calls += c.calls;
  EXPECT_EQ(calls, kShards);
}

TEST_F(ShardedCacheClientTest, EachServerReportsItsShardNameAndASumNone) {
  GrpcCacheClientOptions o;
  for (int i = 0; i < kShards; ++i) {
    absl::StatusOr<std::unique_ptr<GrpcCacheClient>> c = GrpcCacheClient::Create(names_[i], o);
    ASSERT_TRUE(c.ok());
    absl::StatusOr<IndexStats> s = (*c)->Stats();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->shard_name, absl::StrCat("shard-", i));
  }
  EXPECT_EQ(client_->Stats()->shard_name, "");
}

TEST_F(ShardedCacheClientTest, StatsSumTheShards) {
  for (int c = 0; c < 12; ++c) {
    const std::vector<TokenId> t = Prompt(c);
    PutPrefix(*client_, PlacedNamespace(t), t, static_cast<int64_t>(t.size()), StateKind::kExactPrefix, Bytes(500, c));
  }
  absl::StatusOr<IndexStats> sum = client_->Stats();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(sum->pages.entries, 36);
  EXPECT_EQ(sum->states.entries, 12);
  EXPECT_EQ(sum->pages.budget_bytes, kShards * SmallOptions().page_budget_bytes);
  int64_t resident = 0;
  for (int i = 0; i < kShards; ++i) resident += servers_[i]->store().Stats().pages.resident_bytes;
  EXPECT_EQ(sum->pages.resident_bytes, resident);
}

// A shard whose lease ids do not leave the top 16 bits free.
class WideLeaseClient final : public CacheClient {
 public:
  absl::StatusOr<LookupResult> Lookup(const ClientNamespace&, absl::Span<const TokenId>, LookupMode) override {
    LookupResult r;
    r.lease_id = uint64_t{1} << 50;
    return r;
  }
  absl::StatusOr<PutResult> Put(const ClientNamespace&, const ClientPut&, absl::string_view) override {
    return PutResult{};
  }
  absl::Status GetInto(uint64_t, const Hash128&, std::string*) override { return absl::OkStatus(); }
  absl::Status Release(uint64_t lease_id) override {
    released.push_back(lease_id);
    return absl::OkStatus();
  }
  absl::StatusOr<IndexStats> Stats() override { return IndexStats{}; }
  std::vector<uint64_t> released;
};

// A shard whose answers the test sets: every lookup answers `lookup`, every
// Stats `stats`; counts its lookups.
class ScriptedClient final : public CacheClient {
 public:
  absl::StatusOr<LookupResult> Lookup(const ClientNamespace&, absl::Span<const TokenId>, LookupMode) override {
    absl::MutexLock lock(&mu_);
    ++lookups_;
    if (!lookup_.ok()) return lookup_;
    return LookupResult{};
  }
  absl::StatusOr<PutResult> Put(const ClientNamespace&, const ClientPut&, absl::string_view) override {
    return PutResult{};
  }
  absl::Status GetInto(uint64_t, const Hash128&, std::string*) override { return absl::OkStatus(); }
  absl::Status Release(uint64_t) override { return absl::OkStatus(); }
  absl::StatusOr<IndexStats> Stats() override {
    absl::MutexLock lock(&mu_);
    if (!stats_.ok()) return stats_;
    return IndexStats{};
  }
  void Answer(absl::Status lookup, absl::Status stats) {
    absl::MutexLock lock(&mu_);
    lookup_ = std::move(lookup);
    stats_ = std::move(stats);
  }
  int lookups() {
    absl::MutexLock lock(&mu_);
    return lookups_;
  }

 private:
  absl::Mutex mu_;
  absl::Status lookup_ ABSL_GUARDED_BY(mu_);
  absl::Status stats_ ABSL_GUARDED_BY(mu_);
  int lookups_ ABSL_GUARDED_BY(mu_) = 0;
};

// Only UNAVAILABLE and DEADLINE_EXCEEDED (a hung shard) mark a shard down;
// the cache's verdicts and a cancelled call do not. A down shard that
// answers its probe is up again.
TEST(ShardedCacheClientInputTest, OnlyTransportFailuresMarkAShardDown) {
  auto x = std::make_shared<ScriptedClient>();
  auto y = std::make_shared<ScriptedClient>();
  ShardedCacheClientOptions o;
  o.probe_interval = absl::Milliseconds(5);
  absl::StatusOr<std::unique_ptr<ShardedCacheClient>> c =
      ShardedCacheClient::Create({{"x", "x:1", x, nullptr}, {"y", "y:1", y, nullptr}}, o);
  ASSERT_TRUE(c.ok());
  const std::vector<TokenId> t = Tokens(40);
  const std::string owner = *(*c)->OwnerOf(kNamespace.Key(), ChainKeyOf(kNamespace, t));
  ScriptedClient& own = owner == "x" ? *x : *y;
  ScriptedClient& other = owner == "x" ? *y : *x;
  own.Answer(absl::InvalidArgumentError("verdict"), absl::UnavailableError("down"));
  EXPECT_EQ((*c)->Lookup(kNamespace, t, LookupMode::kLease).status().code(), absl::StatusCode::kInvalidArgument);
  own.Answer(absl::CancelledError("cancelled"), absl::UnavailableError("down"));
  EXPECT_EQ((*c)->Lookup(kNamespace, t, LookupMode::kLease).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(*(*c)->OwnerOf(kNamespace.Key(), ChainKeyOf(kNamespace, t)), owner);
  // A hung shard's timeout answers UNAVAILABLE: it is down now, and a
  // DEADLINE_EXCEEDED would start the worker's skip of the whole cache.
  own.Answer(absl::DeadlineExceededError("hung"), absl::UnavailableError("down"));
  const absl::Status hung = (*c)->Lookup(kNamespace, t, LookupMode::kLease).status();
  EXPECT_EQ(hung.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(hung.message(), HasSubstr("timed out (hung): marked down"));
  EXPECT_EQ(own.lookups(), 3);
  // Down: the next lookups go to the other shard, none to it.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE((*c)->Lookup(kNamespace, t, LookupMode::kLease).ok());
  EXPECT_EQ(own.lookups(), 3);
  EXPECT_EQ(other.lookups(), 5);
  // It answers its probe: up, and its chains are its own again.
  own.Answer(absl::OkStatus(), absl::OkStatus());
  ASSERT_TRUE(common::WaitFor([&] { return *(*c)->OwnerOf(kNamespace.Key(), ChainKeyOf(kNamespace, t)) == owner; }));
  EXPECT_TRUE((*c)->Lookup(kNamespace, t, LookupMode::kLease).ok());
  EXPECT_EQ(own.lookups(), 4);
}

TEST(ShardedCacheClientInputTest, RefusesBadShardListsAndLeaseIdsThatDoNotFit) {
  auto wide = std::make_shared<WideLeaseClient>();
  EXPECT_THAT(ShardedCacheClient::Create({CacheShard{"", "a:1", wide, nullptr}}).status().message(),
              HasSubstr("shards[0]: the name is empty"));
  EXPECT_THAT(ShardedCacheClient::Create({CacheShard{"a", "a:1", nullptr, nullptr}}).status().message(),
              HasSubstr("shards[0] (a): no client"));
  EXPECT_THAT(ShardedCacheClient::Create({CacheShard{"a", "a:1", wide, nullptr}, CacheShard{"a", "b:1", wide, nullptr}})
                  .status()
                  .message(),
              HasSubstr("\"a\" is listed more than once"));
  ShardedCacheClientOptions zero;
  zero.probe_interval = absl::ZeroDuration();
  EXPECT_THAT(ShardedCacheClient::Create({CacheShard{"a", "a:1", wide, nullptr}}, zero).status().message(),
              HasSubstr("probe_interval"));

  absl::StatusOr<std::unique_ptr<ShardedCacheClient>> c = ShardedCacheClient::Create({{"a", "a:1", wide, nullptr}});
  ASSERT_TRUE(c.ok());
  absl::StatusOr<LookupResult> r = (*c)->Lookup(kNamespace, Tokens(40), LookupMode::kLease);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(r.status().message(), HasSubstr("48 bits"));
  EXPECT_EQ(wide->released, std::vector<uint64_t>{uint64_t{1} << 50});
  // A failed SetShards keeps the set.
  EXPECT_FALSE((*c)->SetShards({CacheShard{"b", "b:1", nullptr, nullptr}}).ok());
  EXPECT_EQ((*c)->counts().size(), 1u);
  // An empty set (nothing resolved yet) answers every call at once.
  ASSERT_TRUE((*c)->SetShards({}).ok());
  EXPECT_EQ((*c)->Lookup(kNamespace, Tokens(40), LookupMode::kLease).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*c)->Stats().status().code(), absl::StatusCode::kUnavailable);
}

TEST(ShardedCacheClientInputTest, ANameKeepsItsSlotAcrossAMembershipChange) {
  auto a = std::make_shared<WideLeaseClient>();
  absl::StatusOr<std::unique_ptr<ShardedCacheClient>> c =
      ShardedCacheClient::Create({{"a", "10.0.0.1:1", a, nullptr}, {"b", "10.0.0.2:1", a, nullptr}});
  ASSERT_TRUE(c.ok());
  (void)(*c)->Stats();
  // b leaves, a moves to a new address, c joins.
  ASSERT_TRUE((*c)->SetShards({{"a", "10.0.0.9:1", a, nullptr}, {"c", "10.0.0.3:1", a, nullptr}}).ok());
  const std::vector<ShardCounts> counts = (*c)->counts();
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts[0].name, "a");
  EXPECT_EQ(counts[0].target, "10.0.0.9:1");
  EXPECT_EQ(counts[0].calls, 1);  // carried over
  EXPECT_EQ(counts[1].name, "c");
  EXPECT_EQ(counts[1].calls, 0);
}

}  // namespace
}  // namespace hybridserve::cachestore
