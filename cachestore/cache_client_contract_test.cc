// One contract, three implementations: every test here runs against the gRPC
// GrpcCacheClient (a real server on loopback port 0), against the
// ShmCacheClient over it (the same server with its shared-memory socket on),
// and against the InProcessCacheClient, each over a fresh CacheStore on a
// FakeClock.

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cachestore/cache_client.h"
#include "cachestore/cache_store.h"
#include "cachestore/grpc_cache_client.h"
#include "cachestore/in_process_cache_client.h"
#include "cachestore/server.h"
#include "cachestore/shm_cache_client.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/wait_for.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "proto/cachestore.grpc.pb.h"

namespace hybridserve::cachestore {
namespace {

using common::WaitFor;

constexpr int32_t kPageSize = 16;
// The suite's namespace (salt "tenant", tenant "").
const ClientNamespace kNamespace{"fingerprint", "", "tenant", kPageSize};

std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rng() & 0xff);
  return s;
}

std::vector<TokenId> Tokens(int n, int first = 1) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

CacheIndexOptions SmallOptions() {
  CacheIndexOptions o;
  o.page_budget_bytes = int64_t{8} << 20;
  o.state_budget_bytes = int64_t{1} << 20;
  o.lease_ttl = absl::Milliseconds(5500);  // not whole seconds: the wire carries nanos too
  o.max_tokens = 4096;
  return o;
}

// A CacheStore behind one CacheClient implementation.
class Harness {
 public:
  virtual ~Harness() = default;
  virtual absl::Status Start(const CacheIndexOptions& options, const common::Clock& clock) = 0;
  virtual CacheClient& client() = 0;
  virtual CacheStore& store() = 0;
  // The clock LookupResult::lease_expiry is on.
  virtual absl::Time LeaseClockNow() const = 0;
};

class GrpcHarness : public Harness {
 public:
  static constexpr char kName[] = "Grpc";

  absl::Status Start(const CacheIndexOptions& options, const common::Clock& clock) override {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.index = options;
    o.reap_interval = absl::Hours(1);  // nothing expires behind the test's back
    absl::StatusOr<std::unique_ptr<CacheStoreServer>> server = CacheStoreServer::Start(o, clock, registry_);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    // Small chunks, so entries of a few hundred KiB cross several messages.
    GrpcCacheClientOptions client_options;
    client_options.chunk_bytes = 64 << 10;
    absl::StatusOr<std::unique_ptr<GrpcCacheClient>> client =
        GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", server_->port()), client_options);
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
    return absl::OkStatus();
  }
  CacheClient& client() override { return *client_; }
  CacheStore& store() override { return server_->store(); }
  absl::Time LeaseClockNow() const override { return absl::Now(); }
  int port() const { return server_->port(); }

 private:
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::unique_ptr<GrpcCacheClient> client_;
};

// The gRPC harness's server with its shm socket on, read through a
// ShmCacheClient: every read these tests make goes by shared memory, and no
// read may need the gRPC fallback (checked at the end).
class ShmHarness : public Harness {
 public:
  static constexpr char kName[] = "Shm";

  ~ShmHarness() override {
    if (shm_client_ == nullptr) return;
    const ShmReadCounts counts = shm_client_->counts();
    EXPECT_TRUE(counts.fallbacks.empty()) << "a read fell back to gRPC: " << counts.fallbacks.begin()->first;
  }

  absl::Status Start(const CacheIndexOptions& options, const common::Clock& clock) override {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.index = options;
    o.reap_interval = absl::Hours(1);
    // A private directory under /tmp: TEST_TMPDIR is longer than a socket path may be.
    static const std::string* dir = [] {
      char templ[] = "/tmp/hs-contract-XXXXXX";
      const char* made = mkdtemp(templ);
      return new std::string(made != nullptr ? made : "/tmp");
    }();
    o.shm.socket_path = absl::StrCat(*dir, "/", ++sockets_, ".sock");
    absl::StatusOr<std::unique_ptr<CacheStoreServer>> server = CacheStoreServer::Start(o, clock, registry_);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    absl::StatusOr<std::unique_ptr<GrpcCacheClient>> client =
        GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", server_->port()));
    if (!client.ok()) return client.status();
    grpc_client_ = *std::move(client);
    shm_client_ = std::make_unique<ShmCacheClient>(*grpc_client_, ShmReaderOptions{o.shm.socket_path});
    return absl::OkStatus();
  }
  CacheClient& client() override { return *shm_client_; }
  CacheStore& store() override { return server_->store(); }
  absl::Time LeaseClockNow() const override { return absl::Now(); }

 private:
  static inline int sockets_ = 0;
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::unique_ptr<GrpcCacheClient> grpc_client_;
  std::unique_ptr<ShmCacheClient> shm_client_;
};

class InProcessHarness : public Harness {
 public:
  static constexpr char kName[] = "InProcess";

  absl::Status Start(const CacheIndexOptions& options, const common::Clock& clock) override {
    absl::StatusOr<std::unique_ptr<CacheStore>> store = CacheStore::Create(options, clock);
    if (!store.ok()) return store.status();
    store_ = *std::move(store);
    client_ = std::make_unique<InProcessCacheClient>(*store_);
    clock_ = &clock;
    return absl::OkStatus();
  }
  CacheClient& client() override { return *client_; }
  CacheStore& store() override { return *store_; }
  absl::Time LeaseClockNow() const override { return clock_->Now(); }

 private:
  const common::Clock* clock_ = nullptr;  // outlives the harness
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<InProcessCacheClient> client_;
};

// Puts the full pages of tokens[0, p) and a state at p; returns the page keys.
std::vector<Hash128> PutPrefix(CacheClient& client, const ClientNamespace& ns, const std::vector<TokenId>& tokens,
                               int64_t p, StateKind kind, const std::string& state_bytes) {
  std::vector<Hash128> keys = PageKeys(ns.Key(), tokens, ns.page_size);
  const int64_t n = p / ns.page_size;
  for (int64_t i = 0; i < n; ++i) {
    ClientPut page;
    if (i > 0) page.parent = keys[i - 1];
    page.tokens.assign(tokens.begin() + i * ns.page_size, tokens.begin() + (i + 1) * ns.page_size);
    absl::StatusOr<PutResult> r = client.Put(ns, page, Bytes(1000 + i, 100 + i));
    EXPECT_TRUE(r.ok()) << r.status();
  }
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.state_kind = kind;
  if (n > 0) state.parent = keys[n - 1];
  state.tokens.assign(tokens.begin() + n * ns.page_size, tokens.begin() + p);
  state.position = p;
  absl::StatusOr<PutResult> r = client.Put(ns, state, state_bytes);
  EXPECT_TRUE(r.ok()) << r.status();
  return keys;
}

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

using Implementations = ::testing::Types<GrpcHarness, ShmHarness, InProcessHarness>;
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

// The pages of tokens[0, n * kPageSize) in the suite's namespace as puts,
// each hanging from the one before (the first from the root).
std::vector<ClientPut> PageChain(const std::vector<TokenId>& tokens, int n) {
  const std::vector<Hash128> keys = PageKeys(kNamespace.Key(), tokens, kPageSize);
  std::vector<ClientPut> pages(n);
  for (int i = 0; i < n; ++i) {
    if (i > 0) pages[i].parent = keys[i - 1];
    pages[i].tokens.assign(tokens.begin() + i * kPageSize, tokens.begin() + (i + 1) * kPageSize);
  }
  return pages;
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

// A client that dies inside a PutMany (its process gone: the call cancelled
// mid-entry) leaves no reservation behind; the entries it committed stay. Over
// gRPC only: the in-process client's PutMany is one function call, which
// cannot die halfway (a PutSession destroyed uncommitted aborts its put:
// cache_store_test).
TEST(CacheClientPutManyTest, AClientDyingMidStreamLeavesNoReservation) {
  common::FakeClock clock;
  GrpcHarness harness;
  ASSERT_TRUE(harness.Start(SmallOptions(), clock).ok());
  const ClientNamespace ns = kNamespace;
  const std::vector<TokenId> t = Tokens(2 * kPageSize);
  std::vector<ClientPut> chain = PageChain(t, 2);
  const std::string bytes = Bytes(200000, 1);
  ASSERT_TRUE(harness.client().Put(ns, chain[0], bytes).ok());
  // The raw stream: entry 1's header and half of its bytes, then the client
  // is gone.
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", harness.port()), grpc::InsecureChannelCredentials());
  auto stub = v1::CacheStore::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->PutMany(&ctx);
  v1::PutRequest header;
  v1::PutHeader* h = header.mutable_header();
  h->mutable_namespace_()->set_model_fingerprint(ns.model_fingerprint);
  h->mutable_namespace_()->set_tenant(ns.tenant);
  h->mutable_namespace_()->set_cache_salt(ns.cache_salt);
  h->mutable_namespace_()->set_page_size(kPageSize);
  h->set_entry_class(v1::ENTRY_CLASS_PAGE);
  h->mutable_token_ids()->Add(chain[1].tokens.begin(), chain[1].tokens.end());
  h->set_parent_key(chain[1].parent->ToBytes());
  h->set_size_bytes(bytes.size());
  v1::PutRequest chunk;
  chunk.mutable_chunk()->set_offset(0);
  chunk.mutable_chunk()->set_data(bytes.substr(0, 100000));
  ASSERT_TRUE(stream->Write(header));
  ASSERT_TRUE(stream->Write(chunk));
  ASSERT_TRUE(WaitFor([&] { return harness.store().Stats().pages.reserved_bytes == 200000; }))
      << harness.store().Stats().pages.reserved_bytes;
  ctx.TryCancel();
  EXPECT_FALSE(stream->Finish().ok());
  EXPECT_TRUE(WaitFor([&] {
    const IndexStats s = harness.store().Stats();
    return s.pages.reserved_bytes == 0 && s.active_puts == 0;
  })) << harness.store().Stats().pages.reserved_bytes;
  EXPECT_EQ(harness.store().Stats().pages.entries, 1);
  EXPECT_TRUE(harness.store().CheckInvariants().ok());
}

// One script of calls, successes and failures mixed, run through both
// implementations: each step's code and result summary must be identical,
// and equal to the expected codes written here.
std::vector<std::string> RunScript(CacheClient& client) {
  std::vector<std::string> log;
  auto record = [&](const std::string& step, const absl::Status& s, const std::string& detail = "") {
    log.push_back(absl::StrCat(step, ": ", absl::StatusCodeToString(s.code()), " ", detail));
  };
  auto lookup_detail = [](const LookupResult& r) {
    return absl::StrCat("resume=", r.resume_position, " kv=", r.kv_match_tokens, " pages=", r.pages.size(),
                        " state=", r.state.has_value() ? r.state->key.ToHex() : "none", " leased=", r.lease_id != 0);
  };
  const ClientNamespace ns{"fp", "lora", "salt", 4};
  const std::vector<TokenId> t = Tokens(11);
  const std::vector<Hash128> keys = PageKeys(ns.Key(), t, 4);

  absl::StatusOr<LookupResult> miss = client.Lookup(ns, t, LookupMode::kLease);
  record("lookup miss", miss.status(), miss.ok() ? lookup_detail(*miss) : "");
  ClientPut page0;
  page0.tokens = {1, 2, 3, 4};
  absl::StatusOr<PutResult> p0 = client.Put(ns, page0, Bytes(64, 1));
  record("put page 0", p0.status(), p0.ok() ? absl::StrCat(p0->key.ToHex(), " ", p0->already_present) : "");
  absl::StatusOr<PutResult> p0again = client.Put(ns, page0, Bytes(64, 1));
  record("put page 0 again", p0again.status(), p0again.ok() ? absl::StrCat(p0again->already_present) : "");
  ClientPut page1;
  page1.parent = keys[0];
  page1.tokens = {5, 6, 7, 8};
  record("put page 1", client.Put(ns, page1, Bytes(64, 2)).status());
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.parent = keys[1];
  state.tokens = {9, 10};
  state.position = 10;
  const std::string state_bytes = Bytes(777, 3);
  record("put state", client.Put(ns, state, state_bytes).status());
  absl::StatusOr<LookupResult> hit = client.Lookup(ns, t, LookupMode::kLease);
  record("lookup hit", hit.status(), hit.ok() ? lookup_detail(*hit) : "");
  const uint64_t lease = hit.ok() ? hit->lease_id : 0;
  absl::StatusOr<std::string> got = client.Get(lease, StateKey(keys[1], {9, 10}));
  record("get state", got.status(), got.ok() ? absl::StrCat("exact=", *got == state_bytes) : "");
  record("get unknown key", client.Get(lease, Hash128{7, 7}).status());
  record("get unknown lease", client.Get(lease + 99, keys[0]).status());
  record("release", client.Release(lease));
  record("release again", client.Release(lease));
  ClientNamespace odd = ns;
  odd.page_size = 3;
  record("lookup odd page size", client.Lookup(odd, t, LookupMode::kLease).status());
  record("put odd page size", client.Put(odd, page0, Bytes(64, 1)).status());
  ClientPut orphan = page1;
  orphan.parent = Hash128{1, 1};
  record("put orphan", client.Put(ns, orphan, Bytes(64, 4)).status());
  record("put empty state", client.Put(ns, state, "").status());
  record("lookup negative token", client.Lookup(ns, {1, -1}, LookupMode::kProbeOnly).status());
  absl::StatusOr<IndexStats> s = client.Stats();
  record("stats", s.status(),
         s.ok() ? absl::StrCat("pages=", s->pages.entries, "/", s->pages.resident_bytes, " states=", s->states.entries,
                               "/", s->states.resident_bytes, " ns=", s->namespaces, " leases=", s->active_leases,
                               " puts=", s->active_puts, " lookups=", s->lookups, " hits=", s->lookup_hits, "/",
                               s->hits_grid_checkpoint, "/", s->hits_exact_prefix)
                : "");
  return log;
}

TEST(CacheClientParityTest, SameCallsGiveIdenticalResultsAndStatusCodes) {
  common::FakeClock grpc_clock, in_process_clock;
  GrpcHarness grpc;
  InProcessHarness in_process;
  ASSERT_TRUE(grpc.Start(SmallOptions(), grpc_clock).ok());
  ASSERT_TRUE(in_process.Start(SmallOptions(), in_process_clock).ok());
  const std::vector<std::string> over_grpc = RunScript(grpc.client());
  const std::vector<std::string> in_proc = RunScript(in_process.client());
  EXPECT_EQ(over_grpc, in_proc);

  const std::vector<std::string> expected_codes = {
      "lookup miss: OK",
      "put page 0: OK",
      "put page 0 again: OK",
      "put page 1: OK",
      "put state: OK",
      "lookup hit: OK",
      "get state: OK",
      "get unknown key: NOT_FOUND",
      "get unknown lease: NOT_FOUND",
      "release: OK",
      "release again: NOT_FOUND",
      "lookup odd page size: INVALID_ARGUMENT",
      "put odd page size: INVALID_ARGUMENT",
      "put orphan: FAILED_PRECONDITION",
      "put empty state: INVALID_ARGUMENT",
      "lookup negative token: INVALID_ARGUMENT",
      "stats: OK",
  };
  ASSERT_EQ(in_proc.size(), expected_codes.size());
  for (size_t i = 0; i < in_proc.size(); ++i) {
    EXPECT_EQ(in_proc[i].substr(0, expected_codes[i].size() + 1), expected_codes[i] + " ") << in_proc[i];
  }
  const ClientNamespace ns{"fp", "lora", "salt", 4};
  const std::vector<Hash128> keys = PageKeys(ns.Key(), Tokens(11), 4);
  EXPECT_EQ(in_proc[1], absl::StrCat("put page 0: OK ", keys[0].ToHex(), " 0"));
  EXPECT_EQ(in_proc[2], "put page 0 again: OK 1");
  EXPECT_EQ(in_proc[5], absl::StrCat("lookup hit: OK resume=10 kv=8 pages=2 state=", StateKey(keys[1], {9, 10}).ToHex(),
                                     " leased=1"));
  EXPECT_EQ(in_proc[6], "get state: OK exact=1");
  EXPECT_EQ(in_proc[16], "stats: OK pages=2/128 states=1/777 ns=1 leases=0 puts=0 lookups=2 hits=1/0/1");
}

}  // namespace
}  // namespace hybridserve::cachestore
