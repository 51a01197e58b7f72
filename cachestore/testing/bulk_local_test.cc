// The bulk port's server and its reader and writer over an in-process store:
// no gRPC in the process, so the TSan stage can run it (tools/run_tests.sh).
// Several writers and readers at once on their own kept connections, and a
// writer that leaves mid-entry, against the store's invariants.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachestore/client/bulk_reader.h"
#include "cachestore/client/bulk_writer.h"
#include "cachestore/client/client_messages.h"
#include "cachestore/client/direct_put_cache_client.h"
#include "cachestore/client/direct_read_cache_client.h"
#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/server/bulk_server.h"
#include "cachestore/testing/direct_put_test_util.h"
#include "common/clock.h"
#include "common/socket_io.h"
#include "common/wait_for.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

using put_test::Chain;
using put_test::kNs;
using put_test::MakeChain;

class BulkLocalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CacheIndexOptions index;
    index.page_budget_bytes = int64_t{64} << 20;
    index.state_budget_bytes = int64_t{32} << 20;
    auto store = CacheStore::Create(index, clock_);
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
    in_process_ = std::make_unique<InProcessCacheClient>(*store_);
    BulkServerOptions o;
    o.address = "127.0.0.1:0";
    o.io_timeout = absl::Seconds(5);
    auto server = BulkServer::Start(o, *store_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  common::FakeClock clock_;
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<InProcessCacheClient> in_process_;
  std::unique_ptr<BulkServer> server_;
  std::string address_;
};

// Four threads each put two chains over the port and read them back over it,
// through one writer and one reader shared by all (their kept connections
// shared too): every byte lands and reads back, nothing falls back.
TEST_F(BulkLocalTest, ConcurrentWritersAndReadersShareTheirConnectionsAndEveryByteLands) {
  DirectPutCacheClient writer(*in_process_, std::make_unique<BulkWriter>(BulkWriterOptions{address_}));
  DirectReadCacheClient reader(*in_process_, std::make_unique<BulkReader>(BulkReaderOptions{address_}));
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t k = 0; k < 2; ++k) {
        const Chain c = MakeChain(8, 16 << 10, 64 << 10, 10 * t + k + 1);
        for (const absl::StatusOr<PutResult>& r : writer.PutMany(kNs, c.entries)) EXPECT_TRUE(r.ok()) << r.status();
        absl::StatusOr<LookupResult> lookup = reader.Lookup(kNs, c.tokens, LookupMode::kLease);
        ASSERT_TRUE(lookup.ok() && lookup->state.has_value());
        std::vector<Hash128> keys;
        for (const EntryInfo& p : lookup->pages) keys.push_back(p.key);
        keys.push_back(lookup->state->key);
        std::vector<std::string> out(keys.size());
        ASSERT_TRUE(reader.GetManyInto(lookup->lease_id, keys, absl::MakeSpan(out)).ok());
        EXPECT_TRUE(out == c.bytes) << "thread " << t << " chain " << k;
        EXPECT_TRUE(reader.Release(lookup->lease_id).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(writer.counts().fallbacks.empty());
  EXPECT_TRUE(reader.counts().fallbacks.empty());
  EXPECT_EQ(writer.counts().entries, 4 * 2 * 9);
  EXPECT_TRUE(store_->CheckInvariants().ok());
}

// A writer that leaves part way through an entry while others put: its
// reservation (seen held) goes with it, and the others are untouched.
TEST_F(BulkLocalTest, AWriterLeavingMidEntryFreesItsReservationWhileOthersPut) {
  const Chain lone = MakeChain(0, 0, 4 << 20, 50);
  {
    absl::StatusOr<common::Socket> socket = common::Connect(address_, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(socket.ok());
    BulkPutRequest request;
    request.entries.push_back(
        BulkPutEntry{4 << 20, PutHeaderMessage(NamespaceMessage(kNs), lone.puts[0], 4 << 20).SerializeAsString()});
    ASSERT_TRUE(socket
                    ->WriteFull(EncodeBulkPutRequest(request) + lone.bytes[0].substr(0, 1 << 20),
                                absl::Now() + absl::Seconds(10))
                    .ok());
    ASSERT_TRUE(common::WaitFor([&] { return store_->Stats().active_puts == 1; }, absl::Seconds(10)));
    DirectPutCacheClient other(*in_process_, std::make_unique<BulkWriter>(BulkWriterOptions{address_}));
    const Chain c = MakeChain(4, 8 << 10, 32 << 10, 51);
    for (const absl::StatusOr<PutResult>& r : other.PutMany(kNs, c.entries)) EXPECT_TRUE(r.ok()) << r.status();
  }  // the first writer leaves
  ASSERT_TRUE(common::WaitFor([&] { return store_->Stats().active_puts == 0; }, absl::Seconds(10)));
  const IndexStats s = store_->Stats();
  EXPECT_EQ(s.states.reserved_bytes, 0);
  EXPECT_EQ(s.states.entries, 1);  // the other writer's state only
  EXPECT_EQ(s.pages.entries, 4);
  EXPECT_TRUE(store_->CheckInvariants().ok());
}

}  // namespace
}  // namespace hybridserve::cachestore
