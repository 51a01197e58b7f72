// The bulk read path (bulk_protocol.h, bulk_server.h, bulk_reader.h,
// direct_read_cache_client.h) over real TCP on loopback against the real
// cachestore server: the bytes equal gRPC's, a malformed request is refused
// by name, a reader that stalls or leaves mid-response holds nothing, the
// connection limit sends reads to gRPC, rotten bytes end in gRPC's
// DATA_LOSS, and the port is refused beside TLS. The contract suite
// (cache_client_contract_test.cc) runs every read of its own over it too.

#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachestore/client/bulk_reader.h"
#include "cachestore/client/direct_read_cache_client.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/server/server.h"
#include "cachestore/wire/bulk_protocol.h"
#include "common/clock.h"
#include "common/socket_io.h"
#include "common/wait_for.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace hybridserve::cachestore {
namespace {

using common::WaitFor;

constexpr int32_t kPageSize = 16;

std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rng() & 0xff);
  return s;
}

// hybridserve_cache_bulk_reads_total{outcome}.
double BulkReads(prometheus::Registry& registry, const std::string& outcome) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != "hybridserve_cache_bulk_reads_total") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "outcome" && l.value == outcome) return m.counter.value;
      }
    }
  }
  return -1;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

class BulkServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(/*max_connections=*/32); }

  void Start(int max_connections) {
    grpc_.reset();
    direct_.reset();
    server_.reset();
    ServerOptions o;
    o.index.page_budget_bytes = int64_t{64} << 20;
    o.index.state_budget_bytes = int64_t{64} << 20;
    o.bulk.address = "127.0.0.1:0";
    o.bulk.max_connections = max_connections;
    o.bulk.io_timeout = absl::Milliseconds(500);  // a stalled reader is dropped soon
    auto server = CacheStoreServer::Start(o, clock_, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->bulk_port());
    auto client = GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", server_->port()));
    ASSERT_TRUE(client.ok()) << client.status();
    grpc_ = *std::move(client);
    direct_ =
        std::make_unique<DirectReadCacheClient>(*grpc_, std::make_unique<BulkReader>(BulkReaderOptions{address_}));
  }

  // Puts `pages` pages of `page_bytes` and a state of `state_bytes` and leases
  // them: the lease, the page keys (then the state's key) and every entry's
  // bytes in the same order.
  struct Leased {
    uint64_t lease_id = 0;
    std::vector<Hash128> keys;
    std::vector<std::string> bytes;
  };
  Leased PutAndLease(int pages, size_t page_bytes, size_t state_bytes, uint32_t seed) {
    Leased out;
    std::vector<TokenId> tokens(static_cast<size_t>(pages * kPageSize + 3));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(seed * 1000 + i);
    const std::vector<Hash128> page_keys = PageKeys(ns_.Key(), tokens, kPageSize);
    for (int i = 0; i < pages; ++i) {
      ClientPut put;
      if (i > 0) put.parent = page_keys[static_cast<size_t>(i) - 1];
      put.tokens.assign(tokens.begin() + i * kPageSize, tokens.begin() + (i + 1) * kPageSize);
      out.bytes.push_back(Bytes(page_bytes, seed + static_cast<uint32_t>(i)));
      EXPECT_TRUE(grpc_->Put(ns_, put, out.bytes.back()).ok());
    }
    ClientPut state;
    state.entry_class = EntryClass::kState;
    if (pages > 0) state.parent = page_keys[static_cast<size_t>(pages) - 1];
    state.tokens.assign(tokens.begin() + pages * kPageSize, tokens.end());
    state.position = static_cast<int64_t>(tokens.size());
    out.bytes.push_back(Bytes(state_bytes, seed + 1000));
    EXPECT_TRUE(grpc_->Put(ns_, state, out.bytes.back()).ok());
    absl::StatusOr<LookupResult> lookup = grpc_->Lookup(ns_, tokens, LookupMode::kLease);
    EXPECT_TRUE(lookup.ok() && lookup->state.has_value()) << lookup.status();
    if (!lookup.ok() || !lookup->state.has_value()) return out;
    out.lease_id = lookup->lease_id;
    out.keys.assign(page_keys.begin(), page_keys.begin() + pages);
    out.keys.push_back(lookup->state->key);
    return out;
  }

  // A connection that has sent `frame` and read the head of its answer.
  common::Socket SendRaw(const std::string& frame, size_t key_count, absl::StatusOr<BulkResponseHead>* head) {
    absl::StatusOr<common::Socket> s = common::Connect(address_, Soon());
    EXPECT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(s->WriteFull(frame, Soon()).ok());
    *head = ReadBulkResponseHead(*s, key_count, Soon());
    return *std::move(s);
  }

  common::FakeClock clock_;
  prometheus::Registry registry_;
  std::unique_ptr<CacheStoreServer> server_;
  std::string address_;
  std::unique_ptr<GrpcCacheClient> grpc_;
  std::unique_ptr<DirectReadCacheClient> direct_;
  const ClientNamespace ns_{"fingerprint", "", "", kPageSize, "tenant"};
};

TEST_F(BulkServerTest, BulkReadsEqualTheGrpcPathsBytesAndAreCountedAsBulk) {
  const Leased l = PutAndLease(40, 64 << 10, 3000, 1);
  ASSERT_EQ(l.keys.size(), 41u);
  std::vector<std::string> by_bulk(41), by_grpc(41);
  ASSERT_TRUE(direct_->GetManyInto(l.lease_id, l.keys, absl::MakeSpan(by_bulk)).ok());
  ASSERT_TRUE(grpc_->GetManyInto(l.lease_id, l.keys, absl::MakeSpan(by_grpc)).ok());
  EXPECT_EQ(by_bulk, by_grpc);
  EXPECT_EQ(by_bulk, l.bytes);
  // Scattered: each page into two segments of a flat buffer.
  std::string flat(40 * (64 << 10), '\0');
  std::vector<EntrySegments> segments(40);
  for (size_t i = 0; i < 40; ++i) {
    char* page = flat.data() + i * (64 << 10);
    segments[i].segments = {absl::Span<char>(page, 1000), absl::Span<char>(page + 1000, (64 << 10) - 1000)};
  }
  ASSERT_TRUE(direct_->GetManyScattered(l.lease_id, absl::MakeConstSpan(l.keys).subspan(0, 40), segments).ok());
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(flat.substr(i * (64 << 10), 64 << 10), l.bytes[i]) << i;
  const DirectReadCounts counts = direct_->counts();
  EXPECT_EQ(counts.path, "bulk");
  EXPECT_EQ(counts.reads, 2);
  EXPECT_EQ(counts.bytes, 2 * 40 * (64 << 10) + 3000);
  EXPECT_TRUE(counts.fallbacks.empty());
  // Counted once the server's last write returned, which may be after the
  // reader has its bytes.
  EXPECT_TRUE(WaitFor([&] { return BulkReads(registry_, "ok") == 2; }));
}

TEST_F(BulkServerTest, MalformedRequestsAreRefusedByNameAndTheServerServesOn) {
  const Leased l = PutAndLease(2, 4096, 3000, 2);
  std::string bad_magic = EncodeBulkRequest(BulkRequest{l.lease_id, {l.keys[0]}});
  bad_magic[0] ^= 0x01;
  std::string too_many = EncodeBulkRequest(BulkRequest{l.lease_id, std::vector<Hash128>(kBulkMaxKeys + 1)});
  const std::string none = EncodeBulkRequest(BulkRequest{l.lease_id, {}});
  for (const auto& [frame, why] :
       {std::pair{bad_magic, "bad magic"}, std::pair{too_many, "4097 keys"}, std::pair{none, "0 keys"}}) {
    absl::StatusOr<BulkResponseHead> head;
    common::Socket s = SendRaw(frame, 0, &head);
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->status.code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_NE(head->status.message().find(why), absl::string_view::npos) << head->status;
    // The server closes the connection after the refusal.
    char byte = 0;
    EXPECT_FALSE(s.ReadFull(&byte, 1, Soon()).ok());
  }
  // A key outside the lease: NOT_FOUND naming it, the reader's verdict.
  BulkReader reader(BulkReaderOptions{address_});
  std::vector<std::string> out(2);
  bool verdict = false;
  const absl::Status stranger = reader.ReadInto(l.lease_id, {l.keys[0], Hash128{7, 7}}, absl::MakeSpan(out), &verdict);
  EXPECT_EQ(stranger.code(), absl::StatusCode::kNotFound) << stranger;
  EXPECT_NE(stranger.message().find("keys[1]"), absl::string_view::npos) << stranger;
  EXPECT_TRUE(verdict);
  // And the server still serves a well-formed read.
  ASSERT_TRUE(reader.ReadInto(l.lease_id, {l.keys[0], l.keys[1]}, absl::MakeSpan(out), &verdict).ok());
  EXPECT_EQ(out[0], l.bytes[0]);
  EXPECT_TRUE(WaitFor([&] { return BulkReads(registry_, "error") == 4; }));  // three malformed, one NOT_FOUND
}

// A reader that asks for 32 MiB and stops reading after the head is dropped
// after io_timeout; meanwhile and after, other readers read the same entry
// whole, and the lease it read under is intact.
TEST_F(BulkServerTest, AReaderThatStallsOrLeavesMidResponseHoldsNothingAnotherReaderNeeds) {
  const Leased l = PutAndLease(0, 0, size_t{32} << 20, 3);
  ASSERT_EQ(l.keys.size(), 1u);
  const std::string frame = EncodeBulkRequest(BulkRequest{l.lease_id, {l.keys[0]}});
  absl::StatusOr<BulkResponseHead> head;
  common::Socket stalled = SendRaw(frame, 1, &head);
  ASSERT_TRUE(head.ok() && head->status.ok()) << head.status();
  ASSERT_EQ(head->entries[0].size, size_t{32} << 20);
  absl::StatusOr<BulkResponseHead> head2;
  common::Socket leaving = SendRaw(frame, 1, &head2);
  ASSERT_TRUE(head2.ok() && head2->status.ok());
  std::string some(1 << 20, '\0');
  ASSERT_TRUE(leaving.ReadFull(some.data(), some.size(), Soon()).ok());
  EXPECT_EQ(some, l.bytes[0].substr(0, 1 << 20));
  leaving = common::Socket();  // closed mid-response
  EXPECT_EQ(server_->store().Stats().active_leases, 1);
  std::string whole;
  ASSERT_TRUE(direct_->GetInto(l.lease_id, l.keys[0], &whole).ok());
  EXPECT_EQ(whole, l.bytes[0]);
  // The stalled one and the one that left end as failed reads on the server.
  ASSERT_TRUE(WaitFor([&] { return BulkReads(registry_, "error") == 2; }, absl::Seconds(30)));
  EXPECT_TRUE(WaitFor([&] { return BulkReads(registry_, "ok") == 1; }));
  ASSERT_TRUE(WaitFor([&] { return server_->bulk_connections() == 0; }, absl::Seconds(30)));
  whole.clear();
  ASSERT_TRUE(direct_->GetInto(l.lease_id, l.keys[0], &whole).ok());
  EXPECT_EQ(whole, l.bytes[0]);
  EXPECT_TRUE(direct_->counts().fallbacks.empty());
  EXPECT_TRUE(grpc_->Release(l.lease_id).ok());
  EXPECT_TRUE(server_->store().CheckInvariants().ok());
}

// Reads share a kept connection; once the server has closed it (idle past
// its io_timeout, 500 ms here), the next read goes on a new one, not to gRPC.
TEST_F(BulkServerTest, ReadsShareAKeptConnectionAndOneTheServerClosedIsReplaced) {
  const Leased l = PutAndLease(3, 4096, 3000, 6);
  BulkReader reader(BulkReaderOptions{address_});
  std::vector<std::string> out(1);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(reader.ReadInto(l.lease_id, {l.keys[static_cast<size_t>(i)]}, absl::MakeSpan(out)).ok());
    EXPECT_EQ(out[0], l.bytes[static_cast<size_t>(i)]);
    EXPECT_EQ(reader.idle_connections(), 1);
    EXPECT_EQ(server_->bulk_connections(), 1);  // the same connection each time
  }
  // A refusal leaves the connection usable too.
  EXPECT_EQ(reader.ReadInto(l.lease_id, {Hash128{9, 9}}, absl::MakeSpan(out)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reader.idle_connections(), 1);
  ASSERT_TRUE(WaitFor([&] { return server_->bulk_connections() == 0; }));  // closed idle by the server
  ASSERT_TRUE(reader.ReadInto(l.lease_id, {l.keys[3]}, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out[0], l.bytes[3]);
  EXPECT_EQ(reader.idle_connections(), 1);
  // A read that fails part way (an entry that does not fit its destination)
  // does not keep its connection, whose bytes were left unread.
  std::string small(10, '\0');
  EntrySegments wrong;
  wrong.segments = {absl::MakeSpan(small)};
  EXPECT_EQ(reader.ReadScattered(l.lease_id, {l.keys[0]}, {wrong}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reader.idle_connections(), 0);
}

TEST_F(BulkServerTest, ConnectionsBeyondTheLimitAreClosedAndTheReadFallsBackToGrpc) {
  Start(/*max_connections=*/1);
  const Leased l = PutAndLease(1, 4096, 3000, 4);
  // One connection, idle: it takes the only place.
  absl::StatusOr<common::Socket> idle = common::Connect(address_, Soon());
  ASSERT_TRUE(idle.ok());
  ASSERT_TRUE(WaitFor([&] { return server_->bulk_connections() == 1; }));
  std::string state;
  ASSERT_TRUE(direct_->GetInto(l.lease_id, l.keys[1], &state).ok());
  EXPECT_EQ(state, l.bytes[1]);
  const DirectReadCounts counts = direct_->counts();
  EXPECT_EQ(counts.reads, 0);
  ASSERT_EQ(counts.fallbacks.size(), 1u);
  EXPECT_EQ(counts.fallbacks.begin()->first, "unavailable");
}

TEST_F(BulkServerTest, StoredBytesThatRotAreTheReadersDataLossAndGrpcRemovesThem) {
  const Leased l = PutAndLease(1, 4096, 3000, 5);
  auto h = server_->store().Open(l.lease_id, l.keys[1]);
  ASSERT_TRUE(h.ok());
  h->blob->data[2999] ^= 0x02;
  BulkReader reader(BulkReaderOptions{address_});
  std::vector<std::string> out(1);
  bool verdict = true;
  const absl::Status bulk = reader.ReadInto(l.lease_id, {l.keys[1]}, absl::MakeSpan(out), &verdict);
  EXPECT_EQ(bulk.code(), absl::StatusCode::kDataLoss) << bulk;
  EXPECT_FALSE(verdict);  // the path's finding, not the cachestore's answer
  std::string state;
  const absl::Status got = direct_->GetInto(l.lease_id, l.keys[1], &state);
  EXPECT_EQ(got.code(), absl::StatusCode::kDataLoss) << got;
  EXPECT_NE(got.message().find("failed its checksum; removed"), absl::string_view::npos) << got;
  EXPECT_EQ(direct_->counts().fallbacks.at("data_loss"), 1);
  EXPECT_EQ(server_->store().Stats().checksum_failures, 1);
}

TEST(BulkServerOptionsTest, ABulkAddressBesideTlsIsRefused) {
  common::FakeClock clock;
  prometheus::Registry registry;
  ServerOptions o;
  o.bulk.address = "127.0.0.1:0";
  o.tls.cert_file = "/nonexistent/cert.pem";
  o.tls.key_file = "/nonexistent/key.pem";
  auto server = CacheStoreServer::Start(o, clock, registry);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("plain TCP"), absl::string_view::npos) << server.status();
}

// What a reader does with a server that breaks the format: a clear error,
// never a crash or an allocation of what the server merely announces.
TEST(BulkReaderTest, AMalformedOrLyingServerIsAnErrorNotACrash) {
  int port = 0;
  absl::StatusOr<common::Socket> listener = common::Listen("127.0.0.1:0", &port);
  ASSERT_TRUE(listener.ok());
  BulkReader reader(BulkReaderOptions{absl::StrCat("127.0.0.1:", port), absl::Seconds(5)});
  // Each answer the fake gives to one read of one key.
  BulkResponseHead huge;
  huge.entries = {BulkEntry{uint64_t{1} << 39, 0}};  // 512 GiB announced, 3 bytes sent
  BulkResponseHead wrong_count;
  wrong_count.entries = {BulkEntry{3, 0}, BulkEntry{3, 0}};
  std::string bad_magic = EncodeBulkResponseHead(BulkResponseHead{});
  bad_magic[1] ^= 0x10;
  const std::vector<std::pair<std::string, absl::StatusCode>> answers = {
      {EncodeBulkResponseHead(huge) + "abc", absl::StatusCode::kUnavailable},  // closed after 3 bytes
      {EncodeBulkResponseHead(wrong_count), absl::StatusCode::kInvalidArgument},
      {bad_magic, absl::StatusCode::kInvalidArgument},
  };
  for (const auto& [answer, code] : answers) {
    std::thread fake([&, answer = answer] {
      pollfd p{listener->fd(), POLLIN, 0};
      ASSERT_EQ(poll(&p, 1, 10000), 1);
      common::Socket s(accept4(listener->fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      absl::StatusOr<BulkMessage> request = ReadBulkMessage(s, Soon(), /*max_put_bytes=*/0);
      ASSERT_TRUE(request.ok() && request->read.has_value());
      ASSERT_TRUE(s.WriteFull(answer, Soon()).ok());
    });
    std::vector<std::string> out(1);
    const absl::Status s = reader.ReadInto(1, {Hash128{1, 2}}, absl::MakeSpan(out));
    fake.join();
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_LT(out[0].capacity(), size_t{1} << 30);  // nothing near the announced size was allocated
  }
}

}  // namespace
}  // namespace hybridserve::cachestore
