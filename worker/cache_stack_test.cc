#include "worker/cache_stack.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/runfiles.h"
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

}  // namespace
}  // namespace hybridserve::worker
