// What the gRPC client adds to the contract suite: a client that dies inside
// a PutMany stream, one script of calls giving the same results and codes
// over gRPC as in process, and a client that verifies what arrives itself.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachestore/client/grpc_cache_client.h"
#include "cachestore/testing/cache_client_test_harness.h"
#include "common/hash.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/cachestore.grpc.pb.h"

namespace hybridserve::cachestore {
namespace {

using common::WaitFor;

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

// A cachestore that serves one entry (Get, and GetMany of any one key)
// announcing the checksum of `bytes` but sending them with `flip` (if set)
// changed, three chunks of 4096 bytes and the rest.
class OneEntryCachestore final : public v1::CacheStore::Service {
 public:
  OneEntryCachestore(std::string bytes, std::optional<size_t> flip) : bytes_(std::move(bytes)), flip_(flip) {}

  grpc::Status Get(grpc::ServerContext*, const v1::GetRequest*, grpc::ServerWriter<v1::GetResponse>* w) override {
    std::string sent = Sent();
    for (size_t off = 0; off < sent.size(); off += kChunk) {
      v1::GetResponse m;
      if (off == 0) m.set_size_bytes(sent.size()), m.set_checksum(Checksum());
      m.set_offset(off);
      m.set_data(sent.substr(off, kChunk));
      w->Write(m);
    }
    return grpc::Status::OK;
  }
  grpc::Status GetMany(grpc::ServerContext*, const v1::GetManyRequest*,
                       grpc::ServerWriter<v1::GetManyResponse>* w) override {
    std::string sent = Sent();
    for (size_t off = 0; off < sent.size(); off += kChunk) {
      v1::GetManyResponse m;
      if (off == 0) m.set_size_bytes(sent.size()), m.set_checksum(Checksum());
      m.set_offset(off);
      m.set_data(sent.substr(off, kChunk));
      w->Write(m);
    }
    return grpc::Status::OK;
  }

 private:
  static constexpr size_t kChunk = 4096;
  uint64_t Checksum() const { return common::Checksum64(bytes_.data(), bytes_.size()); }
  std::string Sent() const {
    std::string sent = bytes_;
    if (flip_.has_value()) sent[*flip_] ^= 0x08;
    return sent;
  }
  const std::string bytes_;
  const std::optional<size_t> flip_;
};

// Whatever the cachestore verified, the client hashes what arrives and
// answers DATA_LOSS when it is not what the first chunk announced, wherever
// the changed byte lies (in a string, or scattered into segments).
TEST(GrpcCacheClientTest, BytesThatArriveChangedAreDataLossWhereverTheChangeIs) {
  std::string bytes(4096 * 3 + 1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  for (const std::optional<size_t> flip : {std::optional<size_t>(), std::optional<size_t>(3),
                                           std::optional<size_t>(4096 + 5), std::optional<size_t>(bytes.size() - 1)}) {
    SCOPED_TRACE(flip.has_value() ? absl::StrCat("byte ", *flip, " changed") : "intact");
    OneEntryCachestore fake(bytes, flip);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&fake);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    GrpcCacheClientOptions o;
    o.chunk_bytes = 4096;
    auto client = GrpcCacheClient::Create(absl::StrCat("127.0.0.1:", port), o);
    ASSERT_TRUE(client.ok()) << client.status();
    const Hash128 key{1, 2};
    std::string got;
    const absl::Status get = (*client)->GetInto(7, key, &got);
    std::vector<std::string> many(1);
    const absl::Status get_many = (*client)->GetManyInto(7, {key}, absl::MakeSpan(many));
    std::string a(5000, '\0'), b(bytes.size() - 5000, '\0');
    EntrySegments segments;
    segments.segments = {absl::MakeSpan(a), absl::MakeSpan(b)};
    const absl::Status scattered = (*client)->GetManyScattered(7, {key}, {segments});
    if (!flip.has_value()) {
      ASSERT_TRUE(get.ok()) << get;
      ASSERT_TRUE(get_many.ok()) << get_many;
      ASSERT_TRUE(scattered.ok()) << scattered;
      EXPECT_EQ(got, bytes);
      EXPECT_EQ(many[0], bytes);
      EXPECT_EQ(a + b, bytes);
      continue;
    }
    EXPECT_EQ(get.code(), absl::StatusCode::kDataLoss) << get;
    EXPECT_THAT(std::string(get.message()), ::testing::HasSubstr("arrived incomplete or corrupted"));
    EXPECT_EQ(get_many.code(), absl::StatusCode::kDataLoss) << get_many;
    EXPECT_EQ(scattered.code(), absl::StatusCode::kDataLoss) << scattered;
    EXPECT_THAT(std::string(scattered.message()), ::testing::HasSubstr("keys[0]"));
    server->Shutdown();
  }
}

}  // namespace
}  // namespace hybridserve::cachestore
