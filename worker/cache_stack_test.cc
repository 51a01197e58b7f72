#include "worker/cache_stack.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cachestore/cache_client.h"
#include "cachestore/server/server.h"
#include "common/clock.h"
#include "common/runfiles.h"
#include "common/wait_for.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace hybridserve::worker {
namespace {

using ::testing::HasSubstr;

// A cachestore address nothing listens on: every layer's call fails fast
// (connection refused), so each fallback is seen.
constexpr char kNobody[] = "127.0.0.1:1";

CacheStackOptions Options() {
  CacheStackOptions o;
  o.address = kNobody;
  o.timeout = absl::Milliseconds(500);
  return o;
}

// A socket path nothing listens on (a directory that does not exist).
std::string MissingSocket() { return "/nonexistent/cachestore.sock"; }

// The value of `family`'s series, summed over labels; -1 when it has none
// (the registry collects no family without a series).
double Sum(prometheus::Registry& registry, const std::string& family) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != family) continue;
    double sum = 0;
    for (const prometheus::ClientMetric& m : f.metric) sum += m.counter.value;
    return sum;
  }
  return -1;
}

TEST(CacheStackTest, WithoutAnAddressThereIsNoCache) {
  CacheStackOptions o;
  o.shm_socket = MissingSocket();  // ignored without a cachestore
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  ASSERT_TRUE(stack.ok()) << stack.status();
  EXPECT_EQ((*stack)->client(), nullptr);
  EXPECT_EQ((*stack)->grpc(), nullptr);
  EXPECT_EQ((*stack)->direct_reads(), nullptr);
  EXPECT_EQ((*stack)->direct_puts(), nullptr);
  EXPECT_FALSE((*stack)->reads_by_shared_memory());
  EXPECT_EQ((*stack)->Describe(), ", no cache");
}

// A cachestore that is not up is no error: the stack is built, its calls fail.
TEST(CacheStackTest, GrpcAloneWithoutADirectPath) {
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(Options());
  ASSERT_TRUE(stack.ok()) << stack.status();
  ASSERT_NE((*stack)->grpc(), nullptr);
  EXPECT_EQ((*stack)->client(), (*stack)->grpc());
  EXPECT_EQ((*stack)->direct_reads(), nullptr);
  EXPECT_EQ((*stack)->direct_puts(), nullptr);
  EXPECT_EQ((*stack)->Describe("ignored"), ", cachestore 127.0.0.1:1");
}

// Puts in front of reads in front of gRPC: a read through the outermost
// client reaches the shm reader (its fallback is counted), a put reaches the
// shm writer (likewise), and SyncMetrics carries both counts.
TEST(CacheStackTest, ShmPutsInFrontOfShmReadsInFrontOfGrpc) {
  CacheStackOptions o = Options();
  o.shm_socket = MissingSocket();
  absl::StatusOr<std::unique_ptr<CacheStack>> connected = CacheStack::Connect(o);
  ASSERT_TRUE(connected.ok()) << connected.status();
  const CacheStack& stack = **connected;
  ASSERT_NE(stack.direct_puts(), nullptr);
  ASSERT_NE(stack.direct_reads(), nullptr);
  ASSERT_NE(stack.grpc(), nullptr);
  EXPECT_EQ(stack.client(), stack.direct_puts());
  EXPECT_TRUE(stack.reads_by_shared_memory());
  EXPECT_EQ(stack.Describe(),
            absl::StrCat(", cachestore 127.0.0.1:1 (reads and puts by shared memory on ", MissingSocket(), ")"));
  EXPECT_EQ(stack.Describe("note"),
            absl::StrCat(", cachestore 127.0.0.1:1 (reads and puts by shared memory on ", MissingSocket(), ", note)"));

  std::string bytes;
  EXPECT_FALSE(stack.client()->GetInto(1, common::Hash128{1, 2}, &bytes).ok());
  const cachestore::DirectReadCounts reads = stack.direct_reads()->counts();
  EXPECT_EQ(reads.path, "shm");
  EXPECT_EQ(reads.reads, 0);
  int64_t read_fallbacks = 0;
  for (const auto& [reason, n] : reads.fallbacks) read_fallbacks += n;
  EXPECT_EQ(read_fallbacks, 1);

  cachestore::ClientNamespace ns{"fp", "", "", 16};
  cachestore::ClientPut put;
  put.tokens = std::vector<TokenId>(16, 1);
  EXPECT_FALSE(stack.client()->Put(ns, put, std::string(64, 'b')).ok());
  const cachestore::DirectPutCounts puts = stack.direct_puts()->counts();
  EXPECT_EQ(puts.path, "shm");
  EXPECT_EQ(puts.entries, 0);
  int64_t put_fallbacks = 0;
  for (const auto& [reason, n] : puts.fallbacks) put_fallbacks += n;
  EXPECT_EQ(put_fallbacks, 1);

  prometheus::Registry registry;
  DirectReadMetrics read_metrics(registry, "t_cache");
  DirectPutMetrics put_metrics(registry);
  stack.SyncMetrics(read_metrics, put_metrics);
  EXPECT_EQ(Sum(registry, "t_cache_shm_fallbacks_total"), 1);
  // The bulk path's fallback reasons are declared at 0 (common::DeclareFailureReasons), none counted.
  EXPECT_EQ(Sum(registry, "t_cache_bulk_fallbacks_total"), 0);
  EXPECT_EQ(Sum(registry, "hybridserve_worker_direct_put_fallbacks_total"), 1);
}

TEST(CacheStackTest, BulkReadsWithoutDirectPuts) {
  CacheStackOptions o = Options();
  o.bulk_address = "127.0.0.1:2";
  o.direct_puts = false;
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  ASSERT_TRUE(stack.ok()) << stack.status();
  ASSERT_NE((*stack)->direct_reads(), nullptr);
  EXPECT_EQ((*stack)->direct_puts(), nullptr);
  EXPECT_EQ((*stack)->client(), (*stack)->direct_reads());
  EXPECT_FALSE((*stack)->reads_by_shared_memory());
  EXPECT_EQ((*stack)->Describe(), ", cachestore 127.0.0.1:1 (reads over the bulk port 127.0.0.1:2)");
  // Nothing synced for the absent layer: its families hold no series.
  prometheus::Registry registry;
  DirectReadMetrics read_metrics(registry, "t_cache");
  DirectPutMetrics put_metrics(registry);
  (*stack)->SyncMetrics(read_metrics, put_metrics);
  EXPECT_EQ(Sum(registry, "hybridserve_worker_direct_put_entries_total"), -1);
  EXPECT_EQ(Sum(registry, "t_cache_bulk_reads_total"), 0);
}

// With both, the shm socket wins.
TEST(CacheStackTest, TheShmSocketWinsOverTheBulkPort) {
  CacheStackOptions o = Options();
  o.shm_socket = MissingSocket();
  o.bulk_address = "127.0.0.1:2";
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  ASSERT_TRUE(stack.ok()) << stack.status();
  EXPECT_TRUE((*stack)->reads_by_shared_memory());
  EXPECT_EQ((*stack)->direct_reads()->counts().path, "shm");
  EXPECT_EQ((*stack)->direct_puts()->counts().path, "shm");
}

TEST(CacheStackTest, ABulkAddressThatDoesNotParseIsRefused) {
  CacheStackOptions o = Options();
  o.bulk_address = "no-port";
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  EXPECT_EQ(stack.status().code(), absl::StatusCode::kInvalidArgument) << stack.status();
}

// The bulk port carries cache bytes over plain TCP: beside TLS to the
// cachestore a bulk address is refused at start, naming both (reads and puts
// alike), while reads and puts by shared memory (this host, no network) are
// kept, and without TLS the same bulk address is taken.
TEST(CacheStackTest, TheBulkPortIsRefusedBesideTlsSharedMemoryIsNot) {
  const std::string certs = absl::StrCat(std::getenv("TEST_TMPDIR"), "/certs");
  const std::string make =
      absl::StrCat("/usr/bin/python3 ", common::Runfile("tools/make_test_certs.py"), " --out ", certs);
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  CacheStackOptions o = Options();
  o.tls.ca_file = certs + "/ca.pem";
  o.tls.cert_file = certs + "/decode.pem";
  o.tls.key_file = certs + "/decode.key";
  o.bulk_address = "127.0.0.1:2";
  for (const bool puts : {true, false}) {
    o.direct_puts = puts;
    absl::StatusOr<std::unique_ptr<CacheStack>> refused = CacheStack::Connect(o);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("--cachestore_bulk_address"));
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("TLS"));
  }
  o.direct_puts = true;
  o.bulk_address.clear();
  o.shm_socket = MissingSocket();
  absl::StatusOr<std::unique_ptr<CacheStack>> shm = CacheStack::Connect(o);
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_TRUE((*shm)->reads_by_shared_memory());
  EXPECT_EQ((*shm)->client(), (*shm)->direct_puts());
  o.shm_socket.clear();
  o.bulk_address = "127.0.0.1:2";
  o.tls = {};
  absl::StatusOr<std::unique_ptr<CacheStack>> plain = CacheStack::Connect(o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->client(), (*plain)->direct_puts());
  EXPECT_NE((*plain)->direct_reads(), nullptr);
}

// Every sharded form of the flags that cannot work is refused at start,
// naming the flag.
TEST(CacheStackTest, ShardFlagsThatCannotWorkAreRefusedNamingTheFlag) {
  struct Case {
    std::string address, shm, bulk;
    absl::Duration resolve_interval;
    std::string flag;
  };
  const absl::Duration ten = absl::Seconds(10);
  const std::vector<Case> cases = {
      {"127.0.0.1:1,nohost", "", "", ten, "--cachestore: each shard is host:port"},
      {"127.0.0.1:1,", "", "", ten, "--cachestore: each shard is host:port"},
      {"127.0.0.1:1,127.0.0.1:1", "", "", ten, "--cachestore: shard \"127.0.0.1:1\" is listed more than once"},
      {"dns:///nameonly", "", "", ten, "--cachestore: dns:///NAME:PORT"},
      {"dns:///name:1", "", "", absl::ZeroDuration(), "--cachestore_resolve_interval"},
      {"127.0.0.1:1,127.0.0.1:2", "", "127.0.0.1:7", ten,
       "--cachestore_bulk_address: with cachestore shards it is :PORT"},
      {"127.0.0.1:1,127.0.0.1:2", "", ":0", ten, "--cachestore_bulk_address"},
      {"127.0.0.1:1,127.0.0.1:2", "/tmp/a.sock", "", ten, "--cachestore_shm_socket: with cachestore shards"},
      {"127.0.0.1:1,127.0.0.1:2", "a=/x,a=/y", "", ten, "--cachestore_shm_socket: shard \"a\" is named more"},
  };
  for (const Case& c : cases) {
    CacheStackOptions o = Options();
    o.address = c.address;
    o.shm_socket = c.shm;
    o.bulk_address = c.bulk;
    o.resolve_interval = c.resolve_interval;
    absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
    EXPECT_EQ(stack.status().code(), absl::StatusCode::kInvalidArgument) << c.address << " " << stack.status();
    EXPECT_THAT(stack.status().message(), HasSubstr(c.flag)) << c.address;
  }
}

// A list builds one stack per shard, each with its own direct path: shared
// memory for the shard named in --cachestore_shm_socket, the bulk port on its
// own host for the other. Nothing listens: no shard is up yet, no error.
TEST(CacheStackTest, AShardListBuildsOneStackPerShardWithItsOwnDirectPath) {
  CacheStackOptions o = Options();
  o.address = "127.0.0.1:1,127.0.0.2:1";
  o.shm_socket = "127.0.0.1:1=/nonexistent/a.sock";
  o.bulk_address = ":7";
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  ASSERT_TRUE(stack.ok()) << stack.status();
  ASSERT_NE((*stack)->shards(), nullptr);
  EXPECT_EQ((*stack)->client(), &(*stack)->shards()->client());
  EXPECT_EQ((*stack)->grpc(), nullptr);
  EXPECT_FALSE((*stack)->reads_by_shared_memory());
  EXPECT_EQ((*stack)->Describe("note"),
            ", cachestore shards 127.0.0.1:1 (reads and puts by shared memory on /nonexistent/a.sock), "
            "127.0.0.2:1 (reads and puts over the bulk port 127.0.0.2:7) (note)");
  EXPECT_EQ((*stack)->shards()->client().counts().size(), 2u);
  // One plain target keeps the one stack.
  o.address = "127.0.0.1:1";
  o.shm_socket.clear();
  o.bulk_address.clear();
  absl::StatusOr<std::unique_ptr<CacheStack>> one = CacheStack::Connect(o);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->shards(), nullptr);
  EXPECT_EQ((*one)->client(), (*one)->grpc());
}

// A headless Service that resolves to nothing yet (no shard has started) is
// no error: the stack starts with no shard and every call is a miss at once.
TEST(CacheStackTest, AServiceThatDoesNotResolveYetStartsWithNoShard) {
  CacheStackOptions o = Options();
  o.address = "dns:///nonexistent.invalid:1";
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  ASSERT_TRUE(stack.ok()) << stack.status();
  EXPECT_EQ((*stack)->Describe(), ", cachestore shards dns:///nonexistent.invalid:1: none yet");
  cachestore::ClientNamespace ns{"fingerprint", "", "", 16};
  absl::StatusOr<cachestore::LookupResult> r = (*stack)->client()->Lookup(ns, {1, 2}, cachestore::LookupMode::kLease);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("no cachestore shard is known"));
}

double GaugeSum(prometheus::Registry& registry, const std::string& family) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != family) continue;
    double sum = 0;
    for (const prometheus::ClientMetric& m : f.metric) sum += m.gauge.value;
    return sum;
  }
  return -1;
}

// Two cachestore servers on loopback, reporting the names shard-a, shard-b.
class ShardedCacheStackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"shard-a", "shard-b"}) {
      cachestore::ServerOptions o;
      o.address = "127.0.0.1:0";
      o.reap_interval = absl::Hours(1);
      o.service.shard_name = name;
      absl::StatusOr<std::unique_ptr<cachestore::CacheStoreServer>> s =
          cachestore::CacheStoreServer::Start(o, clock_, server_registry_);
      ASSERT_TRUE(s.ok()) << s.status();
      servers_.push_back(*std::move(s));
    }
  }
  std::string Target(int i) const { return absl::StrCat("127.0.0.1:", servers_[i]->port()); }

  common::FakeClock clock_;
  prometheus::Registry server_registry_;
  prometheus::Registry restarted_registry_;  // a server started again on a port
  std::vector<std::unique_ptr<cachestore::CacheStoreServer>> servers_;
};

// A page put by a chain's placement lands on its owner only; with the owner
// stopped, the worker's metrics show it down after one failed call, and the
// chain's lookup is a miss on the other shard, not an error.
TEST_F(ShardedCacheStackTest, ShardsServeByPlacementAndTheirMetricsShowALostOne) {
  CacheStackOptions o = Options();
  o.address = absl::StrCat(Target(0), ",", Target(1));
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  ASSERT_TRUE(stack.ok()) << stack.status();
  cachestore::CacheClient& client = *(*stack)->client();
  cachestore::ClientNamespace ns{"fingerprint", "", "", 16};
  std::vector<TokenId> tokens(16);
  for (int i = 0; i < 16; ++i) tokens[i] = i + 1;
  ns.placement = cachestore::ChainKeyOf(ns, tokens);
  cachestore::ClientPut page;
  page.tokens = tokens;
  ASSERT_TRUE(client.Put(ns, page, std::string(100, 'x')).ok());
  const int owner = servers_[0]->store().Stats().pages.entries == 1 ? 0 : 1;
  EXPECT_EQ(servers_[owner]->store().Stats().pages.entries, 1);
  EXPECT_EQ(servers_[1 - owner]->store().Stats().pages.entries, 0);
  absl::StatusOr<cachestore::LookupResult> hit = client.Lookup(ns, tokens, cachestore::LookupMode::kProbeOnly);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->kv_match_tokens, 16);

  prometheus::Registry registry;
  DirectReadMetrics reads(registry, "t_cache");
  DirectPutMetrics puts(registry);
  CacheShardMetrics shards(registry);
  (*stack)->SyncMetrics(reads, puts, &shards);
  EXPECT_EQ(GaugeSum(registry, "hybridserve_cache_shard_up"), 2);
  EXPECT_EQ(Sum(registry, "hybridserve_cache_shard_calls_total"), 2);
  EXPECT_EQ(Sum(registry, "hybridserve_cache_shard_failures_total"), 0);

  servers_[owner]->Shutdown(absl::ZeroDuration());
  servers_[owner]->Wait();
  EXPECT_EQ(client.Lookup(ns, tokens, cachestore::LookupMode::kProbeOnly).status().code(),
            absl::StatusCode::kUnavailable);
  absl::StatusOr<cachestore::LookupResult> miss = client.Lookup(ns, tokens, cachestore::LookupMode::kProbeOnly);
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(miss->kv_match_tokens, 0);
  (*stack)->SyncMetrics(reads, puts, &shards);
  EXPECT_EQ(GaugeSum(registry, "hybridserve_cache_shard_up"), 1);
  EXPECT_EQ(Sum(registry, "hybridserve_cache_shard_calls_total"), 4);
  EXPECT_EQ(Sum(registry, "hybridserve_cache_shard_failures_total"), 1);
}

// dns:/// resolves the name to addresses and asks each for its shard name:
// the shard is placed by "shard-a", not by its address.
TEST_F(ShardedCacheStackTest, AHeadlessServiceNameGivesShardsNamedByWhatTheyReport) {
  CacheStackOptions o = Options();
  o.address = absl::StrCat("dns:///localhost:", servers_[0]->port());
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  ASSERT_TRUE(stack.ok()) << stack.status();
  ASSERT_NE((*stack)->shards(), nullptr);
  const std::vector<cachestore::ShardCounts> counts = (*stack)->shards()->client().counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].name, "shard-a");
  EXPECT_EQ(counts[0].target, absl::StrCat("ipv4:", Target(0)));
  EXPECT_EQ((*stack)->Describe(), absl::StrCat(", cachestore shards ", o.address, ": shard-a at ipv4:", Target(0)));
  EXPECT_TRUE((*stack)->client()->Stats().ok());
  // A resolution again keeps the shard (its calls, its slot).
  (*stack)->shards()->Resolve();
  EXPECT_EQ((*stack)->shards()->client().counts()[0].calls, 1);
}

// A new address is asked its name with the call timeout, not the down-shard
// prober's: with a prober deadline no call can meet, the shard still joins
// at the first resolution (it was left out before, so its chains were placed
// on the other shards until a later resolution).
TEST_F(ShardedCacheStackTest, AShardIsAskedItsNameWithTheCallTimeoutNotTheProbers) {
  CacheStackOptions o = Options();
  o.address = absl::StrCat("dns:///localhost:", servers_[0]->port());
  o.probe_timeout = absl::Nanoseconds(1);
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  ASSERT_TRUE(stack.ok()) << stack.status();
  ASSERT_NE((*stack)->shards(), nullptr);
  const std::vector<cachestore::ShardCounts> counts = (*stack)->shards()->client().counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].name, "shard-a");
}

// An address that resolves but does not answer is asked again within about a
// second, not after the whole resolve interval (an hour here): a shard that
// was slow to answer a starting pod joins its set as soon as it answers.
TEST_F(ShardedCacheStackTest, AnAddressThatDidNotAnswerIsAskedAgainSoon) {
  const int port = servers_[1]->port();
  servers_[1]->Shutdown(absl::ZeroDuration());
  servers_[1]->Wait();
  CacheStackOptions o = Options();
  o.address = absl::StrCat("dns:///localhost:", port);
  o.resolve_interval = absl::Hours(1);
  absl::StatusOr<std::unique_ptr<CacheStack>> stack = CacheStack::Connect(o);
  ASSERT_TRUE(stack.ok()) << stack.status();
  ASSERT_NE((*stack)->shards(), nullptr);
  EXPECT_TRUE((*stack)->shards()->client().counts().empty());

  cachestore::ServerOptions so;
  so.address = absl::StrCat("127.0.0.1:", port);
  so.reap_interval = absl::Hours(1);
  so.service.shard_name = "shard-b";
  absl::StatusOr<std::unique_ptr<cachestore::CacheStoreServer>> again =
      cachestore::CacheStoreServer::Start(so, clock_, restarted_registry_);
  ASSERT_TRUE(again.ok()) << again.status();
  servers_[1] = *std::move(again);
  // The bound is far above the one-second retry and far below the hour.
  ASSERT_TRUE(common::WaitFor([&] { return !(*stack)->shards()->client().counts().empty(); }, absl::Minutes(2)));
  const std::vector<cachestore::ShardCounts> counts = (*stack)->shards()->client().counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].name, "shard-b");
}

}  // namespace
}  // namespace hybridserve::worker
