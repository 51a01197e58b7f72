// Puts over the bulk port (bulk_protocol.h "HBP1", bulk_server.h,
// bulk_writer.h, direct_put_cache_client.h) over real TCP on loopback against
// the real cachestore server: what lands is what Get returns, each entry a
// request misdescribes is refused alone and its bytes dropped, a request
// larger than the store is refused before its bytes, a writer that leaves or
// stalls mid-entry takes its reservation with it, and a failed path sends the
// puts to gRPC. The contract suite (cache_client_contract_test.cc) runs every
// put of its own over the port too.

#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cachestore/client/bulk_writer.h"
#include "cachestore/client/client_messages.h"
#include "cachestore/client/direct_put_cache_client.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/server/server.h"
#include "cachestore/testing/direct_put_test_util.h"
#include "cachestore/wire/bulk_protocol.h"
#include "cachestore/wire/wire_ints.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/socket_io.h"
#include "common/wait_for.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "proto/cachestore.pb.h"

namespace hybridserve::cachestore {
namespace {

using common::WaitFor;

using put_test::Answer;
using put_test::Bytes;
using put_test::Chain;
using put_test::Counter;
using put_test::ExpectAnswers;
using put_test::kNs;
using put_test::kPageSize;
using put_test::MakeChain;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

class BulkPutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.index.page_budget_bytes = int64_t{32} << 20;
    o.index.state_budget_bytes = int64_t{16} << 20;
    o.bulk.address = "127.0.0.1:0";
    o.bulk.io_timeout = absl::Milliseconds(500);  // a stalled writer is dropped soon
    auto server = CacheStoreServer::Start(o, clock_, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->bulk_port());
    auto client = GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", server_->port()));
    ASSERT_TRUE(client.ok()) << client.status();
    grpc_ = *std::move(client);
  }

  // Every entry of `c` read back through gRPC, in the chain's order.
  std::vector<std::string> ReadBack(const Chain& c) {
    absl::StatusOr<LookupResult> lookup = grpc_->Lookup(kNs, c.tokens, LookupMode::kLease);
    EXPECT_TRUE(lookup.ok()) << lookup.status();
    if (!lookup.ok() || !lookup->state.has_value()) return {};
    std::vector<std::string> out;
    for (const EntryInfo& page : lookup->pages) out.push_back(grpc_->Get(lookup->lease_id, page.key).value_or(""));
    out.push_back(grpc_->Get(lookup->lease_id, lookup->state->key).value_or(""));
    EXPECT_TRUE(grpc_->Release(lookup->lease_id).ok());
    return out;
  }

  // What the store holds: committed and reserved bytes of both classes, and
  // puts in flight.
  std::string Holdings() const {
    const IndexStats s = server_->store().Stats();
    return absl::StrCat("pages ", s.pages.entries, "/", s.pages.resident_bytes, "/", s.pages.reserved_bytes, " states ",
                        s.states.entries, "/", s.states.resident_bytes, "/", s.states.reserved_bytes, " puts ",
                        s.active_puts);
  }

  // A put request's head for `entries` (each its header and size).
  static std::string Head(const std::vector<std::pair<const ClientPut*, size_t>>& entries) {
    BulkPutRequest request;
    for (const auto& [put, size] : entries) {
      request.entries.push_back(
          BulkPutEntry{size, PutHeaderMessage(NamespaceMessage(kNs), *put, size).SerializeAsString()});
    }
    return EncodeBulkPutRequest(request);
  }
  static std::string Sum(absl::string_view bytes) {
    std::string out;
    wire::PutU64(&out, common::Checksum64(bytes.data(), bytes.size()));
    return out;
  }
  common::FakeClock clock_;
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::string address_;
  std::unique_ptr<GrpcCacheClient> grpc_;
};

TEST_F(BulkPutTest, BulkPutsStoreWhatGetReturnsOnAKeptConnectionAndAreCountedAsBulk) {
  BulkWriterOptions wo{address_};
  wo.request_bytes = int64_t{1} << 20;  // 40 pages of 64 KiB and a 3 MiB state: four requests
  auto writer = std::make_unique<BulkWriter>(wo);
  BulkWriter* w = writer.get();
  DirectPutCacheClient client(*grpc_, std::move(writer));
  const Chain c = MakeChain(40, 64 << 10, 3 << 20, 1);
  std::vector<absl::StatusOr<PutResult>> results = client.PutMany(kNs, c.entries);
  ASSERT_EQ(results.size(), c.entries.size());
  for (const absl::StatusOr<PutResult>& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->already_present);
  }
  EXPECT_TRUE(ReadBack(c) == c.bytes) << "the bytes read back differ";
  for (const absl::StatusOr<PutResult>& r : client.PutMany(kNs, c.entries)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->already_present);
  }
  EXPECT_EQ(w->idle_connections(), 1);  // one connection carried all eight requests
  const DirectPutCounts counts = client.counts();
  EXPECT_EQ(counts.path, "bulk");
  EXPECT_EQ(counts.calls, 2);
  EXPECT_EQ(counts.entries, 82);
  EXPECT_TRUE(counts.fallbacks.empty());
  EXPECT_EQ(Counter(registry_, "hybridserve_cache_bulk_puts_total", "ok"), 82);
  EXPECT_EQ(Counter(registry_, "hybridserve_cache_bulk_put_bytes_total", ""), 40 * (64 << 10) + (3 << 20));
  EXPECT_EQ(Counter(registry_, "hybridserve_cache_puts_total", "ok"), 82);
  EXPECT_TRUE(server_->store().CheckInvariants().ok());
}

TEST_F(BulkPutTest, EntriesARequestMisdescribesAreRefusedAloneTheirBytesDroppedAndTheRestStored) {
  const Chain c = MakeChain(1, 4096, 100, 5);
  const Chain d = MakeChain(1, 2048, 100, 6);
  // 0: its header's size_bytes is not the table's size; 1: its bytes do not
  // hash to the checksum after them; 2: the store refuses it (a state of no
  // bytes); 3: an honest page of another prompt; 4: the same page again
  // (already present: its bytes are dropped).
  BulkPutRequest request;
  request.entries.push_back(
      BulkPutEntry{4000, PutHeaderMessage(NamespaceMessage(kNs), c.puts[0], 4096).SerializeAsString()});
  request.entries.push_back(
      BulkPutEntry{4096, PutHeaderMessage(NamespaceMessage(kNs), c.puts[0], 4096).SerializeAsString()});
  request.entries.push_back(BulkPutEntry{0, PutHeaderMessage(NamespaceMessage(kNs), c.puts[1], 0).SerializeAsString()});
  request.entries.push_back(
      BulkPutEntry{2048, PutHeaderMessage(NamespaceMessage(kNs), d.puts[0], 2048).SerializeAsString()});
  request.entries.push_back(
      BulkPutEntry{2048, PutHeaderMessage(NamespaceMessage(kNs), d.puts[0], 2048).SerializeAsString()});
  std::string frame = EncodeBulkPutRequest(request);
  frame += c.bytes[0].substr(0, 4000) + Sum(c.bytes[0].substr(0, 4000));
  std::string bad = Sum(c.bytes[0]);
  bad[0] = static_cast<char>(bad[0] ^ 1);
  frame += c.bytes[0] + bad;
  frame += Sum("");
  frame += d.bytes[0] + Sum(d.bytes[0]);
  frame += d.bytes[0] + Sum(d.bytes[0]);
  absl::StatusOr<common::Socket> socket = common::Connect(address_, Soon());
  ASSERT_TRUE(socket.ok());
  ASSERT_TRUE(socket->WriteFull(frame, Soon()).ok());
  absl::StatusOr<BulkPutResponse> r = ReadBulkPutResponse(*socket, 5, Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->status.ok()) << r->status;
  const std::vector<std::pair<absl::StatusCode, const char*>> expected = {
      {absl::StatusCode::kInvalidArgument, "size_bytes 4096 is not the entry's size 4000"},
      {absl::StatusCode::kDataLoss, "checksum"},
      {absl::StatusCode::kInvalidArgument, ""},
      {absl::StatusCode::kOk, ""},
      {absl::StatusCode::kOk, ""},
  };
  ExpectAnswers(r->answers, expected);
  EXPECT_TRUE(Answer(r->answers[4]).result().already_present());
  EXPECT_EQ(Holdings(), "pages 1/2048/0 states 0/0/0 puts 0");
  // The connection serves on: the first entry, honest this time.
  frame = Head({{&c.puts[0], 4096}}) + c.bytes[0] + Sum(c.bytes[0]);
  ASSERT_TRUE(socket->WriteFull(frame, Soon()).ok());
  r = ReadBulkPutResponse(*socket, 1, Soon());
  ASSERT_TRUE(r.ok() && r->status.ok());
  EXPECT_EQ(Answer(r->answers[0]).code(), 0);
  EXPECT_EQ(Holdings(), "pages 2/6144/0 states 0/0/0 puts 0");
  EXPECT_EQ(Counter(registry_, "hybridserve_cache_bulk_puts_total", "error"), 3);
}

TEST_F(BulkPutTest, MalformedOrOversizedRequestsAreRefusedByNameBeforeTheirBytes) {
  const Chain c = MakeChain(1, 4096, 100, 7);
  // Declaring more than the store's budgets together (48 MiB) is refused
  // before any byte is read.
  std::string too_big = Head({{&c.puts[0], uint64_t{1} << 30}});
  std::string headers_disagree = Head({{&c.puts[0], 4096}});
  headers_disagree[8] = static_cast<char>(headers_disagree[8] + 1);
  std::string no_entries = Head({{&c.puts[0], 4096}});
  std::memset(no_entries.data() + 4, 0, 4);
  struct Case {
    const char* name;
    std::string frame;
    const char* says;
  };
  for (const Case& k : std::vector<Case>{{"too big", too_big, "more than this cachestore could store"},
                                         {"headers of another length", headers_disagree, "headers add up to"},
                                         {"no entries", no_entries, "0 entries"}}) {
    SCOPED_TRACE(k.name);
    absl::StatusOr<common::Socket> socket = common::Connect(address_, Soon());
    ASSERT_TRUE(socket.ok());
    ASSERT_TRUE(socket->WriteFull(k.frame, Soon()).ok());
    absl::StatusOr<BulkPutResponse> r = ReadBulkPutResponse(*socket, 1, Soon());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status.code(), absl::StatusCode::kInvalidArgument) << r->status;
    EXPECT_TRUE(absl::StrContains(r->status.message(), k.says)) << r->status;
  }
  EXPECT_EQ(Holdings(), "pages 0/0/0 states 0/0/0 puts 0");
  // The server serves on.
  DirectPutCacheClient client(*grpc_, std::make_unique<BulkWriter>(BulkWriterOptions{address_}));
  for (const absl::StatusOr<PutResult>& r : client.PutMany(kNs, c.entries)) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(client.counts().fallbacks.empty());
}

// A writer that leaves, or stalls past the server's io_timeout, part way
// through an entry: its reservation (seen held first) is gone with it, and
// the same entry can be put at once.
TEST_F(BulkPutTest, AWriterThatLeavesOrStallsMidEntryTakesItsReservationWithIt) {
  const Chain c = MakeChain(0, 0, 4 << 20, 8);  // one 4 MiB state
  for (const bool leave : {true, false}) {
    SCOPED_TRACE(leave ? "leaves" : "stalls");
    {
      absl::StatusOr<common::Socket> socket = common::Connect(address_, Soon());
      ASSERT_TRUE(socket.ok());
      ASSERT_TRUE(socket->WriteFull(Head({{&c.puts[0], 4 << 20}}) + c.bytes[0].substr(0, 1 << 20), Soon()).ok());
      ASSERT_TRUE(WaitFor([&] { return server_->store().Stats().active_puts == 1; }, absl::Seconds(10))) << Holdings();
      EXPECT_EQ(server_->store().Stats().states.reserved_bytes, 4 << 20);
      if (!leave) {
        // Stalled: the server drops it after io_timeout.
        ASSERT_TRUE(WaitFor([&] { return server_->store().Stats().active_puts == 0; }, absl::Seconds(10)))
            << Holdings();
      }
    }  // leaves (or, stalled, is closed at last)
    ASSERT_TRUE(WaitFor([&] { return server_->store().Stats().active_puts == 0; }, absl::Seconds(10))) << Holdings();
    EXPECT_EQ(Holdings(), "pages 0/0/0 states 0/0/0 puts 0");
  }
  DirectPutCacheClient client(*grpc_, std::make_unique<BulkWriter>(BulkWriterOptions{address_}));
  for (const absl::StatusOr<PutResult>& r : client.PutMany(kNs, c.entries)) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(client.counts().fallbacks.empty());
  EXPECT_TRUE(ReadBack(c) == c.bytes) << "the bytes read back differ";
  EXPECT_TRUE(server_->store().CheckInvariants().ok());
}

TEST_F(BulkPutTest, AKeptConnectionTheServerClosedIsReplacedAndNoPortFallsBackToGrpc) {
  auto writer = std::make_unique<BulkWriter>(BulkWriterOptions{address_});
  BulkWriter* w = writer.get();
  DirectPutCacheClient client(*grpc_, std::move(writer));
  const Chain a = MakeChain(2, 4096, 1000, 9);
  for (const absl::StatusOr<PutResult>& r : client.PutMany(kNs, a.entries)) ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(w->idle_connections(), 1);
  // The server closes the idle connection after its io_timeout.
  ASSERT_TRUE(WaitFor([&] { return server_->bulk_connections() == 0; }, absl::Seconds(10)));
  const Chain b = MakeChain(2, 4096, 1000, 10);
  for (const absl::StatusOr<PutResult>& r : client.PutMany(kNs, b.entries)) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(client.counts().fallbacks.empty());
  EXPECT_TRUE(ReadBack(b) == b.bytes) << "the bytes read back differ";

  // No port: every entry goes to gRPC, counted.
  DirectPutCacheClient nowhere(*grpc_, std::make_unique<BulkWriter>(BulkWriterOptions{"127.0.0.1:1"}));
  const Chain d = MakeChain(2, 4096, 1000, 11);
  for (const absl::StatusOr<PutResult>& r : nowhere.PutMany(kNs, d.entries)) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ReadBack(d) == d.bytes) << "the bytes read back differ";
  const DirectPutCounts counts = nowhere.counts();
  EXPECT_EQ(counts.entries, 0);
  ASSERT_EQ(counts.fallbacks.size(), 1u);
  EXPECT_EQ(counts.fallbacks.begin()->first, "unavailable");
}

}  // namespace
}  // namespace hybridserve::cachestore
