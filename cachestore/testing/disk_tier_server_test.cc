// The disk tier behind a real cachestore server over gRPC on loopback
// (docs/ARCHITECTURE.md section 4, "The disk tier"): a server shut down as
// on SIGTERM writes its memory to --disk_dir, a new server on the same
// directory answers the lookup from disk and serves the bytes; a small
// memory spills evictions and reports the tier in LookupResponse, Stats and
// the hybridserve_cache_disk_* metrics.

#include <unistd.h>

#include <cstdlib>

#include "cachestore/testing/service_test_fixture.h"

namespace hybridserve::cachestore {
namespace {

class DiskTierServerTest : public ServiceTest {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/disk_server_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_", getpid());
  }
  void TearDown() override {
    ServiceTest::TearDown();
    server_.reset();
    std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }
  ServerOptions WithDisk() {
    ServerOptions o;
    o.disk.directory = dir_;
    o.disk.budget_bytes = int64_t{64} << 20;
    return o;
  }
  v1::LookupResponse RawLookup(const std::vector<TokenId>& tokens) {
    v1::LookupRequest req;
    req.mutable_namespace_()->set_model_fingerprint(ns_.model_fingerprint);
    req.mutable_namespace_()->set_page_size(ns_.page_size);
    for (TokenId t : tokens) req.add_token_ids(t);
    req.set_probe_only(true);
    req.set_omit_pages(true);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::LookupResponse resp;
    EXPECT_TRUE(stub_->Lookup(&ctx, req, &resp).ok());
    return resp;
  }
  v1::StatsResponse RawStats() {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::StatsResponse resp;
    EXPECT_TRUE(stub_->Stats(&ctx, v1::StatsRequest(), &resp).ok());
    return resp;
  }
  // The value of a counter or gauge of `name` whose labels include `label`=`value`
  // (any when `label` is empty); -1 when absent.
  double Metric(const std::string& name, const std::string& label = "", const std::string& value = "") {
    for (const prometheus::MetricFamily& f : registry_.Collect()) {
      if (f.name != name) continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        bool match = label.empty();
        for (const prometheus::ClientMetric::Label& l : m.label) match |= l.name == label && l.value == value;
        if (match) return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
      }
    }
    return -1;
  }
  // The state's bytes through a lease, as a worker reads them.
  std::string ReadState(const std::vector<TokenId>& tokens) {
    auto r = client_->Lookup(ns_, tokens, LookupMode::kLease);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || !r->state.has_value()) return "";
    auto got = client_->Get(r->lease_id, r->state->key);
    EXPECT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(client_->Release(r->lease_id).ok());
    return got.ok() ? *got : "";
  }

  std::string dir_;
};

TEST_F(DiskTierServerTest, ARestartOnTheSameDirectoryFindsTheStateTheShutdownSpilled) {
  const std::vector<TokenId> t = Tokens(70);
  Start(WithDisk());
  const std::string state = PutPrefix(ns_, t, 70, 4096, 100000, 3);  // 4 pages and a state at 70
  EXPECT_EQ(RawStats().disk().entries(), 0u);                        // nothing evicted
  server_->Shutdown(absl::Seconds(5));                               // what SIGTERM does
  EXPECT_EQ(server_->store().Stats().disk.shutdown_spilled, 5);
  server_.reset();

  Start(WithDisk());
  EXPECT_EQ(RawStats().disk().entries(), 5u);
  const v1::LookupResponse r = RawLookup(t);
  EXPECT_EQ(r.resume_position(), 70u);
  EXPECT_EQ(r.page_count(), 4u);
  EXPECT_EQ(r.pages_from_disk(), 4u);
  EXPECT_TRUE(r.state_from_disk());
  EXPECT_EQ(ReadState(t), state);
  const v1::StatsResponse s = RawStats();
  EXPECT_EQ(s.disk().promoted_entries(), 5u);
  EXPECT_EQ(s.disk().read_hits(), 5u);
  EXPECT_EQ(s.lookup_hits(), 2u);
}

TEST_F(DiskTierServerTest, EvictionsSpillAndTheLookupReportsTheTier) {
  ServerOptions o = WithDisk();
  o.index.page_budget_bytes = 2 * (4096 + CacheIndexOptions::kDefaultEntryOverheadBytes);
  o.index.state_budget_bytes = 100000 + CacheIndexOptions::kDefaultEntryOverheadBytes + 64;
  Start(o);
  const std::vector<TokenId> a = Tokens(40, 1);
  const std::vector<TokenId> b = Tokens(40, 1001);
  const std::string state_a = PutPrefix(ns_, a, 40, 4096, 100000, 1);  // 2 pages and a state
  PutPrefix(ns_, b, 40, 4096, 100000, 2);                              // a to disk
  server_->store().FlushDiskWrites();
  const v1::LookupResponse r = RawLookup(a);
  EXPECT_EQ(r.resume_position(), 40u);
  EXPECT_EQ(r.pages_from_disk(), 2u);
  EXPECT_TRUE(r.state_from_disk());
  const v1::LookupResponse again = RawLookup(a);  // now in memory
  EXPECT_EQ(again.resume_position(), 40u);
  EXPECT_EQ(again.pages_from_disk(), 0u);
  EXPECT_FALSE(again.state_from_disk());
  EXPECT_EQ(ReadState(a), state_a);

  server_->store().FlushDiskWrites();
  server_->ReapOnce();                                                             // syncs the metrics
  EXPECT_EQ(Metric("hybridserve_cache_disk_writes_total", "outcome", "ok"), 6.0);  // a, then b
  EXPECT_EQ(Metric("hybridserve_cache_disk_reads_total", "outcome", "ok"), 3.0);
  EXPECT_EQ(Metric("hybridserve_cache_disk_promoted_bytes_total"), 2 * 4096 + 100000.0);
  EXPECT_EQ(Metric("hybridserve_cache_disk_entries"), 6.0);
  EXPECT_EQ(Metric("hybridserve_cache_disk_bytes", "state", "budget"), static_cast<double>(int64_t{64} << 20));
}

TEST_F(DiskTierServerTest, WithoutADiskDirectoryStatsHaveNoDiskAndLookupsReportMemory) {
  Start();
  const std::vector<TokenId> t = Tokens(40);
  PutPrefix(ns_, t, 40, 4096, 1000, 1);
  const v1::LookupResponse r = RawLookup(t);
  EXPECT_EQ(r.resume_position(), 40u);
  EXPECT_EQ(r.pages_from_disk(), 0u);
  EXPECT_FALSE(r.state_from_disk());
  EXPECT_FALSE(RawStats().has_disk());
}

TEST_F(DiskTierServerTest, ASecondServerOnALockedDirectoryDoesNotStart) {
  Start(WithDisk());
  ServerOptions o = WithDisk();
  o.address = "127.0.0.1:0";
  auto second = CacheStoreServer::Start(o, clock_, registry_);
  EXPECT_TRUE(HasStatus(second.status(), absl::StatusCode::kFailedPrecondition, "in use by another DiskTier"));
}

}  // namespace
}  // namespace hybridserve::cachestore
