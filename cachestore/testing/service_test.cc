// The cachestore service over real gRPC on loopback (port 0).
//
// Every status that proto/cachestore.proto and the README document for an RPC
// is produced over the wire at least once, with its exact code and a message
// that names the cause (the PutMany rows are tested in service_put_many_test.cc):
//
// RPC      status               cause                                  test
// Lookup   INVALID_ARGUMENT     too many tokens, negative token id,    LookupRejectsBadRequests
//                               bad page size, empty fingerprint
// Put      INVALID_ARGUMENT     no header first, ended before commit,  MalformedPutStreamsAreRejected
//                               chunks out of order, overrun, two
//                               headers, malformed parent key, bad
//                               page size or class, position vs tail,
//                               ttl on a page, chunk over the maximum
//          INVALID_ARGUMENT     a state of no bytes                    BadInputGetsAClearStatusAndChangesNothing
//          RESOURCE_EXHAUSTED   entry larger than its class's budget   BadInputGetsAClearStatusAndChangesNothing
//          RESOURCE_EXHAUSTED   budget held by leased entries          LeaseOfAVanishedReaderExpires
//          RESOURCE_EXHAUSTED   budget held by in-flight puts          PutInFlightHoldsItsBudgetAndItsEntry
//          FAILED_PRECONDITION  parent page not in the cache           MalformedPutStreamsAreRejected
//          DATA_LOSS            checksum mismatch at commit            CorruptedChunkFailsTheCommitAndStoresNothing
//          ABORTED              same entry in flight                   PutInFlightHoldsItsBudgetAndItsEntry
//          ABORTED              reclaimed after put_timeout            StalledPutIsReclaimedAndItsStreamAborted
// PutMany  per entry: Put's     answered in order, the rest of an      PutManyAnswersEntriesInOrderAndDropsThe...
//          FAILED_PRECONDITION, answered entry dropped
//          DATA_LOSS (and the
//          contract suite's)
//          INVALID_ARGUMENT     chunk or commit outside an entry,      MalformedPutManyStreamsEndNamingTheEntry
//                               header inside one, ended inside one,
//                               out of order, commit before every byte
//          ABORTED              reclaimed after put_timeout            StalledPutManyIsReclaimedAndItsStreamAborted
// Get      INVALID_ARGUMENT     malformed key                          BadInputGetsAClearStatusAndChangesNothing
//          NOT_FOUND            unknown lease, key the lease does not  BadInputGetsAClearStatusAndChangesNothing
//                               hold
//          DATA_LOSS            stored bytes fail their checksum       StoredBytesThatRotAreNotServed,
//                               (an entry's last chunk is never sent)  ARottedEntryOfManyChunksNeverHasItsLastChunk...
// GetMany  INVALID_ARGUMENT     no keys, over 4096, malformed key[i]   MalformedGetManyRequestsAreRejectedByName
//          NOT_FOUND            keys[i] not held by the lease          MalformedGetManyRequestsAreRejectedByName
//          DATA_LOSS            keys[i] fails its checksum             GetManyNamesTheEntryThatRotted
// Release  NOT_FOUND            unknown lease                          BadInputGetsAClearStatusAndChangesNothing
// Lookup   RESOURCE_EXHAUSTED   --max_leases leases open               IndexLimitsAndKeyVersionsAreRefusedOverTheWire
// Put      RESOURCE_EXHAUSTED   --max_namespaces namespaces held       IndexLimitsAndKeyVersionsAreRefusedOverTheWire
// every    INVALID_ARGUMENT     namespace key_version 1, 2 or unknown IndexLimitsAndKeyVersionsAreRefusedOverTheWire
// Put      RESOURCE_EXHAUSTED   the machine cannot allocate the entry  AnEntryTheMachineCannotHoldIsRefusedCounted...
// every    RESOURCE_EXHAUSTED   --max_streams, --max_streams_per_peer  streams_test.cc:
//                                                                      EveryMethodIsRefusedBeyondTheCallLimits

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cachestore/testing/service_test_fixture.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

using common::WaitFor;
using ::testing::HasSubstr;

// Issue 10, item 2: with omit_pages a lookup answer's size does not depend
// on the chain's length (the client derives the page keys from its tokens,
// as the gRPC client does); page_count says how many pages the lease holds.
TEST_F(ServiceTest, ALookupAnswerWithOmitPagesDoesNotGrowWithTheChain) {
  ClientNamespace ns;
  ns.model_fingerprint = "long-chains";
  ns.page_size = 4;
  auto answer = [&](const std::vector<TokenId>& tokens, bool omit) {
    v1::LookupRequest req;
    req.mutable_namespace_()->set_model_fingerprint(ns.model_fingerprint);
    req.mutable_namespace_()->set_page_size(ns.page_size);
    req.mutable_token_ids()->Add(tokens.begin(), tokens.end());
    req.set_omit_pages(omit);
    req.set_probe_only(true);
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    grpc::Status s = stub_->Lookup(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  };
  const std::vector<TokenId> short_chain = Tokens(2 * 4 + 1, 1);
  const std::vector<TokenId> long_chain = Tokens(600 * 4 + 1, 100000);
  PutPrefix(ns, short_chain, 2 * 4 + 1, 16, 32, 1);
  PutPrefix(ns, long_chain, 600 * 4 + 1, 16, 32, 2);
  const v1::LookupResponse small = answer(short_chain, true);
  const v1::LookupResponse large = answer(long_chain, true);
  EXPECT_EQ(small.page_count(), 2u);
  EXPECT_EQ(large.page_count(), 600u);
  EXPECT_EQ(large.pages_size(), 0);
  EXPECT_LE(large.ByteSizeLong(), small.ByteSizeLong() + 8);  // longer varints of 4 larger numbers only
  EXPECT_LT(large.ByteSizeLong(), 128u);
  // Without it the pages are listed, as before.
  EXPECT_EQ(answer(long_chain, false).pages_size(), 600);
}

TEST_F(ServiceTest, LargeEntriesRoundTripThroughChunkedStreams) {
  // 64 MiB + 3 bytes: far over gRPC's 4 MiB default, and not a chunk multiple.
  std::vector<TokenId> t = Tokens(40);
  std::string state = PutPrefix(ns_, t, 37, 5 << 20, (64 << 20) + 3, 7);
  auto r = client_->Lookup(ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resume_position, 37);
  EXPECT_EQ(r->kv_match_tokens, 32);
  ASSERT_EQ(r->pages.size(), 2u);
  ASSERT_TRUE(r->state.has_value());
  EXPECT_EQ(r->state->size_bytes, (64 << 20) + 3);
  auto got = client_->Get(r->lease_id, r->state->key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == state);
  auto page = client_->Get(r->lease_id, r->pages[1].key);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(*page == Bytes(5 << 20, 7 + 1));
  EXPECT_TRUE(client_->Release(r->lease_id).ok());
}

TEST_F(ServiceTest, RepeatedPutIsAlreadyPresent) {
  std::vector<TokenId> t = Tokens(16);
  ClientPut page;
  page.tokens = t;
  ASSERT_TRUE(client_->Put(ns_, page, Bytes(1000, 1)).ok());
  auto again = client_->Put(ns_, page, Bytes(1000, 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->already_present);
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pages.entries, 1);
  EXPECT_EQ(stats->pages.resident_bytes, 1000);
}

TEST_F(ServiceTest, ConcurrentClientsSeeTheirOwnConversations) {
  constexpr int kClients = 8;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = GrpcCacheClient::Create(target_);
      if (!client.ok()) return void(failures[c] = "client");
      ClientNamespace ns{"fingerprint", "", "tenant" + std::to_string(c), kPageSize};
      std::vector<TokenId> t = Tokens(100, c * 1000);
      for (int turn = 1; turn <= 5; ++turn) {
        const int64_t p = turn * 19;
        std::vector<Hash128> keys = PageKeys(ns.Key(), t, kPageSize);
        for (int64_t i = 0; i < p / kPageSize; ++i) {
          ClientPut page;
          if (i > 0) page.parent = keys[i - 1];
          page.tokens.assign(t.begin() + i * kPageSize, t.begin() + (i + 1) * kPageSize);
          if (!(*client)->Put(ns, page, Bytes(4096, c * 100 + i)).ok()) return void(failures[c] = "page put");
        }
        ClientPut state;
        state.entry_class = EntryClass::kState;
        const int64_t n = p / kPageSize;
        if (n > 0) state.parent = keys[n - 1];
        state.tokens.assign(t.begin() + n * kPageSize, t.begin() + p);
        state.position = p;
        std::string bytes = Bytes(100000, c * 100 + turn);
        if (!(*client)->Put(ns, state, bytes).ok()) return void(failures[c] = "state put");
        auto r = (*client)->Lookup(ns, t, LookupMode::kLease);
        if (!r.ok() || r->resume_position != p) return void(failures[c] = "lookup");
        auto got = (*client)->Get(r->lease_id, r->state->key);
        if (!got.ok() || *got != bytes) return void(failures[c] = "get");
        if (!(*client)->Release(r->lease_id).ok()) return void(failures[c] = "release");
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(failures[c], "") << "client " << c;
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->namespaces, kClients);
  EXPECT_EQ(stats->active_leases, 0);
}

TEST_F(ServiceTest, CorruptedChunkFailsTheCommitAndStoresNothing) {
  std::string bytes = Bytes(10000, 3);
  std::vector<v1::PutRequest> msgs(3);
  *msgs[0].mutable_header() = Header(ns_, bytes.size());
  msgs[1].mutable_chunk()->set_offset(0);
  std::string corrupted = bytes;
  corrupted[5000] ^= 0x01;
  msgs[1].mutable_chunk()->set_data(corrupted);
  msgs[2].mutable_commit()->set_checksum(common::Checksum64(bytes.data(), bytes.size()));
  EXPECT_TRUE(HasStatus(RawPut(msgs), grpc::StatusCode::DATA_LOSS, "checksum mismatch"));
  auto r = client_->Lookup(ns_, {5}, LookupMode::kLease);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->resume_position, 0);
  EXPECT_EQ(server_->store().Stats().states.reserved_bytes, 0);
}

TEST_F(ServiceTest, StoredBytesThatRotAreNotServed) {
  std::vector<TokenId> t = Tokens(20);
  PutPrefix(ns_, t, 18, 1000, 5000, 11);
  auto r = client_->Lookup(ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok());
  // Flip a byte of the stored state behind the store's back.
  auto h = server_->store().OpenVerified(r->lease_id, r->state->key);
  ASSERT_TRUE(h.ok());
  h->blob->data[123] ^= 0x40;
  auto got = client_->Get(r->lease_id, r->state->key);
  EXPECT_TRUE(HasStatus(got.status(), absl::StatusCode::kDataLoss, "failed its checksum; removed"));
  auto again = client_->Lookup(ns_, t, LookupMode::kLease);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->resume_position, 0);  // removed
  EXPECT_EQ(again->kv_match_tokens, 16);
  EXPECT_EQ(server_->store().Stats().checksum_failures, 1);
}

// Get hashes an entry's bytes as it sends them: a rotted entry of several
// chunks has every chunk but its last sent, never the last, wherever the rot
// is, and is removed.
TEST_F(ServiceTest, ARottedEntryOfManyChunksNeverHasItsLastChunkSent) {
  for (const size_t rotten : {size_t{5}, size_t{4096 * 4 + 100}}) {  // in the first chunk, in the last
    SCOPED_TRACE(rotten);
    const std::vector<TokenId> t = Tokens(20, static_cast<int>(rotten));
    PutPrefix(ns_, t, 18, 1000, 4096 * 5, 11);  // the state: 5 chunks of 4096 bytes
    auto r = client_->Lookup(ns_, t, LookupMode::kLease);
    ASSERT_TRUE(r.ok() && r->state.has_value()) << r.status();
    auto h = server_->store().Open(r->lease_id, r->state->key);
    ASSERT_TRUE(h.ok());
    h->blob->data[rotten] ^= 0x10;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::GetRequest req;
    req.set_lease_id(r->lease_id);
    req.set_key(r->state->key.ToBytes());
    req.set_chunk_bytes(4096);
    auto reader = stub_->Get(&ctx, req);
    v1::GetResponse msg;
    int messages = 0;
    while (reader->Read(&msg)) ++messages;
    EXPECT_TRUE(HasStatus(reader->Finish(), grpc::StatusCode::DATA_LOSS, "failed its checksum; removed"));
    EXPECT_EQ(messages, 4);
    auto again = client_->Lookup(ns_, t, LookupMode::kProbeOnly);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->resume_position, 0);  // removed
    EXPECT_TRUE(client_->Release(r->lease_id).ok());
  }
  EXPECT_EQ(server_->store().Stats().checksum_failures, 2);
}

TEST_F(ServiceTest, BadInputGetsAClearStatusAndChangesNothing) {
  std::vector<TokenId> t = Tokens(20);
  PutPrefix(ns_, t, 18, 1000, 5000, 11);
  const IndexStats before = server_->store().Stats();

  EXPECT_TRUE(HasStatus(client_->Get(424242, Hash128{1, 2}).status(), absl::StatusCode::kNotFound,
                        "unknown or expired lease 424242"));
  EXPECT_TRUE(HasStatus(client_->Release(424242), absl::StatusCode::kNotFound, "unknown or expired lease 424242"));
  auto lease = client_->Lookup(ns_, t, LookupMode::kLease);
  ASSERT_TRUE(lease.ok() && lease->lease_id != 0) << lease.status();
  EXPECT_TRUE(HasStatus(client_->Get(lease->lease_id, Hash128{1, 2}).status(), absl::StatusCode::kNotFound,
                        "does not hold entry"));
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::GetRequest req;
    req.set_lease_id(lease->lease_id);
    req.set_key("fifteen bytes!!");
    auto reader = stub_->Get(&ctx, req);
    v1::GetResponse msg;
    EXPECT_FALSE(reader->Read(&msg));
    EXPECT_TRUE(HasStatus(reader->Finish(), grpc::StatusCode::INVALID_ARGUMENT, "key must be 16 bytes, got 15"));
  }
  EXPECT_TRUE(client_->Release(lease->lease_id).ok());

  ClientPut empty;
  empty.entry_class = EntryClass::kState;
  empty.tokens = Tokens(5, 500);
  empty.position = 5;
  EXPECT_TRUE(HasStatus(client_->Put(ns_, empty, "").status(), absl::StatusCode::kInvalidArgument,
                        "state entry size 0 must be > 0"));
  const IndexStats after = server_->store().Stats();
  EXPECT_EQ(after.pages.resident_bytes, before.pages.resident_bytes);
  EXPECT_EQ(after.states.resident_bytes, before.states.resident_bytes);
  EXPECT_EQ(after.pages.reserved_bytes + after.states.reserved_bytes, 0);
  EXPECT_EQ(after.active_leases, 0);

  // Larger than the budget.
  ServerOptions small;
  small.index.state_budget_bytes = 1 << 20;
  TearDown();
  server_.reset();
  Start(small);
  ClientPut big;
  big.entry_class = EntryClass::kState;
  big.tokens = {1, 2};
  big.position = 2;
  EXPECT_TRUE(HasStatus(client_->Put(ns_, big, Bytes(2 << 20, 1)).status(), absl::StatusCode::kResourceExhausted,
                        "exceeds the state budget of 1048576 bytes"));
  EXPECT_EQ(server_->store().Stats().states.reserved_bytes, 0);
}

// Issue 10 (items 2, 5 and the key version): the index's bounds and the key
// derivation's version, each refused over the wire by a message naming it.
TEST_F(ServiceTest, IndexLimitsAndKeyVersionsAreRefusedOverTheWire) {
  ServerOptions limited;
  limited.index.max_leases = 1;
  limited.index.max_namespaces = 1;
  TearDown();
  server_.reset();
  Start(limited);
  std::vector<TokenId> t = Tokens(20);
  PutPrefix(ns_, t, 18, 1000, 5000, 3);
  auto held = client_->Lookup(ns_, t, LookupMode::kLease);
  ASSERT_TRUE(held.ok() && held->lease_id != 0) << held.status();
  EXPECT_TRUE(HasStatus(client_->Lookup(ns_, t, LookupMode::kLease).status(), absl::StatusCode::kResourceExhausted,
                        "max_leases=1 leases are open"));
  EXPECT_TRUE(client_->Lookup(ns_, t, LookupMode::kProbeOnly).ok());  // a probe takes no lease
  ASSERT_TRUE(client_->Release(held->lease_id).ok());
  ClientNamespace other = ns_;
  other.cache_salt = "another tenant";
  ClientPut state;
  state.entry_class = EntryClass::kState;
  state.tokens = {1, 2};
  state.position = 2;
  EXPECT_TRUE(HasStatus(client_->Put(other, state, Bytes(100, 1)).status(), absl::StatusCode::kResourceExhausted,
                        "max_namespaces=1"));
  for (uint32_t version : {1u, 2u, 4u}) {
    v1::LookupRequest req;
    req.mutable_namespace_()->set_model_fingerprint(ns_.model_fingerprint);
    req.mutable_namespace_()->set_page_size(ns_.page_size);
    req.mutable_namespace_()->set_key_version(version);
    req.add_token_ids(1);
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    EXPECT_TRUE(HasStatus(stub_->Lookup(&ctx, req, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("key_version ", version)));
  }
}

// Issue 10, item 6: an entry larger than the machine can allocate (the
// budgets allow it) is RESOURCE_EXHAUSTED naming the size, leaves no
// namespace or reservation behind, and counts as a failed put.
TEST_F(ServiceTest, AnEntryTheMachineCannotHoldIsRefusedCountedAndLeavesNothing) {
  ServerOptions huge;
  huge.index.page_budget_bytes = int64_t{1} << 62;
  huge.index.state_budget_bytes = int64_t{1} << 62;
  huge.index.blob_pool_bytes = 0;
  TearDown();
  server_.reset();
  Start(huge);
  v1::PutRequest header;
  *header.mutable_header() = Header(ns_, uint64_t{1} << 60);
  EXPECT_TRUE(
      HasStatus(RawPut({header}), grpc::StatusCode::RESOURCE_EXHAUSTED, "cannot allocate 1152921504606846976 bytes"));
  const IndexStats after = server_->store().Stats();
  EXPECT_EQ(after.namespaces, 0);
  EXPECT_EQ(after.active_puts, 0);
  EXPECT_EQ(after.states.reserved_bytes + after.states.metadata_bytes, 0);
  auto failed_puts = [&] {
    for (const prometheus::MetricFamily& f : registry_.Collect()) {
      if (f.name != "hybridserve_cache_puts_total") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        for (const prometheus::ClientMetric::Label& l : m.label) {
          if (l.name == "outcome" && l.value == "error") return m.counter.value;
        }
      }
    }
    return -1.0;
  };
  // Recorded when gRPC is done with the call, which may be just after the
  // client has its status.
  EXPECT_TRUE(WaitFor([&] { return failed_puts() == 1.0; })) << "failed puts counted: " << failed_puts();
}

TEST_F(ServiceTest, MalformedGetManyRequestsAreRejectedByName) {
  std::vector<TokenId> t = Tokens(20);
  PutPrefix(ns_, t, 18, 1000, 5000, 11);
  auto r = client_->Lookup(ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok() && r->state.has_value()) << r.status();
  auto call = [&](const v1::GetManyRequest& req, int* messages) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    auto reader = stub_->GetMany(&ctx, req);
    v1::GetManyResponse msg;
    *messages = 0;
    while (reader->Read(&msg)) ++*messages;
    return reader->Finish();
  };
  int messages = 0;
  v1::GetManyRequest none;
  none.set_lease_id(r->lease_id);
  grpc::Status st = call(none, &messages);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "1 to 4096 keys")) << st.error_message();

  v1::GetManyRequest too_many = none;
  for (int i = 0; i < 4097; ++i) too_many.add_keys(r->state->key.ToBytes());
  EXPECT_TRUE(HasStatus(call(too_many, &messages), grpc::StatusCode::INVALID_ARGUMENT, "1 to 4096 keys, got 4097"));
  EXPECT_EQ(messages, 0);

  v1::GetManyRequest short_key = none;
  short_key.add_keys(r->state->key.ToBytes());
  short_key.add_keys("seven b");
  st = call(short_key, &messages);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "keys[1]")) << st.error_message();
  EXPECT_EQ(messages, 0);  // checked before anything is sent

  // The first entry whole, then NOT_FOUND naming the second.
  v1::GetManyRequest stranger = none;
  stranger.add_keys(r->state->key.ToBytes());
  stranger.add_keys(Hash128{1, 2}.ToBytes());
  st = call(stranger, &messages);
  EXPECT_TRUE(HasStatus(st, grpc::StatusCode::NOT_FOUND, "keys[1]: lease"));
  EXPECT_EQ(messages, 1);  // 5000 bytes: one chunk
  EXPECT_TRUE(client_->Release(r->lease_id).ok());
}

TEST_F(ServiceTest, MalformedPutStreamsAreRejected) {
  std::string bytes = Bytes(10000, 3);
  const uint64_t sum = common::Checksum64(bytes.data(), bytes.size());
  auto chunk = [&](uint64_t off, size_t n) { return ChunkOf(bytes, off, n); };
  v1::PutRequest header;
  *header.mutable_header() = Header(ns_, bytes.size());
  v1::PutRequest commit;
  commit.mutable_commit()->set_checksum(sum);

  // No header first.
  EXPECT_TRUE(HasStatus(RawPut({chunk(0, 100)}), grpc::StatusCode::INVALID_ARGUMENT, "starts with a header"));
  // Ends before all bytes arrived.
  EXPECT_TRUE(HasStatus(RawPut({header, chunk(0, 5000), commit}), grpc::StatusCode::INVALID_ARGUMENT,
                        "put ended early: 5000 of 10000 bytes arrived"));
  // Ends without a commit.
  EXPECT_TRUE(HasStatus(RawPut({header, chunk(0, 10000)}), grpc::StatusCode::INVALID_ARGUMENT,
                        "put stream ended before commit"));
  // Chunks out of order.
  EXPECT_TRUE(HasStatus(RawPut({header, chunk(5000, 5000), chunk(0, 5000), commit}), grpc::StatusCode::INVALID_ARGUMENT,
                        "out of order: expected offset 0"));
  // More bytes than declared.
  v1::PutRequest extra = chunk(0, 10000);
  extra.mutable_chunk()->mutable_data()->append("x");
  EXPECT_TRUE(
      HasStatus(RawPut({header, extra, commit}), grpc::StatusCode::INVALID_ARGUMENT, "overruns the declared size"));
  // Two headers.
  EXPECT_TRUE(HasStatus(RawPut({header, header}), grpc::StatusCode::INVALID_ARGUMENT, "carries one header"));
  // Malformed parent key, bad page size, bad class, position disagreeing with tail.
  v1::PutRequest bad = header;
  bad.mutable_header()->set_parent_key("short");
  EXPECT_TRUE(HasStatus(RawPut({bad}), grpc::StatusCode::INVALID_ARGUMENT, "header.parent_key must be 16 bytes"));
  bad = header;
  bad.mutable_header()->mutable_namespace_()->set_page_size(12);
  EXPECT_TRUE(HasStatus(RawPut({bad}), grpc::StatusCode::INVALID_ARGUMENT, "page_size 12"));
  bad = header;
  bad.mutable_header()->set_entry_class(v1::ENTRY_CLASS_UNSPECIFIED);
  EXPECT_TRUE(HasStatus(RawPut({bad}), grpc::StatusCode::INVALID_ARGUMENT, "entry_class must be PAGE or STATE"));
  bad = header;
  bad.mutable_header()->set_position(3);
  EXPECT_TRUE(HasStatus(RawPut({bad}), grpc::StatusCode::INVALID_ARGUMENT, "state position 3 disagrees"));
  bad = header;
  bad.mutable_header()->set_entry_class(v1::ENTRY_CLASS_PAGE);
  bad.mutable_header()->clear_token_ids();
  for (int i = 0; i < kPageSize; ++i) bad.mutable_header()->add_token_ids(i);
  bad.mutable_header()->mutable_ttl()->set_seconds(60);
  EXPECT_TRUE(HasStatus(RawPut({bad}), grpc::StatusCode::INVALID_ARGUMENT, "applies to states only"));
  v1::PutRequest huge;
  huge.mutable_chunk()->set_offset(0);
  huge.mutable_chunk()->set_data(std::string((4 << 20) + 1, 'x'));
  EXPECT_TRUE(HasStatus(RawPut({header, huge}), grpc::StatusCode::INVALID_ARGUMENT, "chunk of 4194305 bytes exceeds"));
  bad = header;
  bad.mutable_header()->set_parent_key(Hash128{5, 6}.ToBytes());
  EXPECT_TRUE(HasStatus(RawPut({bad}), grpc::StatusCode::FAILED_PRECONDITION, "is not in the cache"));

  // None of it left anything behind; a well-formed stream then works.
  IndexStats s = server_->store().Stats();
  EXPECT_EQ(s.states.entries + s.pages.entries, 0);
  EXPECT_EQ(s.states.reserved_bytes + s.pages.reserved_bytes, 0);
  EXPECT_TRUE(RawPut({header, chunk(0, 4000), chunk(4000, 6000), commit}).ok());
}

TEST_F(ServiceTest, LookupRejectsBadRequests) {
  ServerOptions o;
  o.index.max_tokens = 64;
  TearDown();
  server_.reset();
  Start(o);
  EXPECT_TRUE(HasStatus(client_->Lookup(ns_, Tokens(65), LookupMode::kLease).status(),
                        absl::StatusCode::kInvalidArgument, "65 tokens exceed max_tokens=64"));
  EXPECT_TRUE(HasStatus(client_->Lookup(ns_, {1, -2}, LookupMode::kLease).status(), absl::StatusCode::kInvalidArgument,
                        "negative token id -2"));
  ClientNamespace odd = ns_;
  odd.page_size = 6;
  EXPECT_TRUE(HasStatus(client_->Lookup(odd, Tokens(8), LookupMode::kLease).status(),
                        absl::StatusCode::kInvalidArgument, "page_size 6 is not a power of two"));
  ClientNamespace anonymous = ns_;
  anonymous.model_fingerprint.clear();
  EXPECT_TRUE(HasStatus(client_->Lookup(anonymous, Tokens(8), LookupMode::kLease).status(),
                        absl::StatusCode::kInvalidArgument, "model_fingerprint is empty"));
}

TEST_F(ServiceTest, LeaseOfAVanishedReaderExpires) {
  ServerOptions o;
  o.index.lease_ttl = absl::Seconds(5);
  o.index.state_budget_bytes = 8000;
  TearDown();
  server_.reset();
  Start(o);
  std::vector<TokenId> t = Tokens(20);
  PutPrefix(ns_, t, 18, 1000, 5000, 11);
  auto r = client_->Lookup(ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok());
  ASSERT_NE(r->lease_id, 0u);
  // The reader vanishes without Release. While leased, the state holds its
  // budget: another state cannot push it out.
  ClientPut other;
  other.entry_class = EntryClass::kState;
  other.tokens = {9, 9};
  other.position = 2;
  EXPECT_TRUE(HasStatus(client_->Put(ns_, other, Bytes(5000, 2)).status(), absl::StatusCode::kResourceExhausted,
                        "held by leased, pinned or in-flight states"));
  clock_.Advance(absl::Seconds(6));
  server_->ReapOnce();
  EXPECT_TRUE(HasStatus(client_->Get(r->lease_id, r->state->key).status(), absl::StatusCode::kNotFound,
                        "unknown or expired lease"));
  EXPECT_EQ(server_->store().Stats().active_leases, 0);
  EXPECT_EQ(server_->store().Stats().expired_leases, 1);
  EXPECT_TRUE(client_->Put(ns_, other, Bytes(5000, 2)).ok());
}

TEST_F(ServiceTest, GetManyNamesTheEntryThatRotted) {
  std::vector<TokenId> t = Tokens(20);
  PutPrefix(ns_, t, 18, 1000, 5000, 11);
  auto r = client_->Lookup(ns_, t, LookupMode::kLease);
  ASSERT_TRUE(r.ok() && r->state.has_value() && r->pages.size() == 1u) << r.status();
  auto h = server_->store().OpenVerified(r->lease_id, r->pages[0].key);
  ASSERT_TRUE(h.ok());
  h->blob->data[7] ^= 0x01;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetManyRequest req;
  req.set_lease_id(r->lease_id);
  req.add_keys(r->state->key.ToBytes());
  req.add_keys(r->pages[0].key.ToBytes());
  auto reader = stub_->GetMany(&ctx, req);
  v1::GetManyResponse msg;
  int messages = 0;
  while (reader->Read(&msg)) ++messages;
  EXPECT_TRUE(HasStatus(reader->Finish(), grpc::StatusCode::DATA_LOSS, "keys[1]: entry"));
  EXPECT_EQ(messages, 1);  // the state whole (one chunk), nothing of the page
  EXPECT_EQ(server_->store().Stats().checksum_failures, 1);
  EXPECT_TRUE(client_->Release(r->lease_id).ok());
}

// A put in flight holds its reservation: a second put of the same entry is
// ABORTED and a put that needs the budget it holds is RESOURCE_EXHAUSTED,
// until the first finishes.
TEST_F(ServiceTest, PutInFlightHoldsItsBudgetAndItsEntry) {
  ServerOptions o;
  o.index.state_budget_bytes = 8000;
  TearDown();
  server_.reset();
  Start(o);
  const std::string bytes = Bytes(5000, 4);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::PutResponse resp;
  auto writer = stub_->Put(&ctx, &resp);
  v1::PutRequest header;
  *header.mutable_header() = Header(ns_, bytes.size());
  ASSERT_TRUE(writer->Write(header));
  ASSERT_TRUE(WaitFor([&] { return server_->store().Stats().states.reserved_bytes == 5000; }));

  EXPECT_TRUE(HasStatus(RawPut({header}), grpc::StatusCode::ABORTED, "a put of this state is in flight"));
  v1::PutRequest other = header;
  other.mutable_header()->set_token_ids(0, 6);
  EXPECT_TRUE(HasStatus(RawPut({other}), grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "state budget of 8000 bytes is held by leased, pinned or in-flight states"));

  v1::PutRequest chunk;
  chunk.mutable_chunk()->set_offset(0);
  chunk.mutable_chunk()->set_data(bytes);
  v1::PutRequest commit;
  commit.mutable_commit()->set_checksum(common::Checksum64(bytes.data(), bytes.size()));
  ASSERT_TRUE(writer->Write(chunk));
  ASSERT_TRUE(writer->Write(commit));
  writer->WritesDone();
  EXPECT_TRUE(writer->Finish().ok());
  EXPECT_EQ(server_->store().Stats().states.entries, 1);
}

// The README and CacheClient promise ABORTED for a put reclaimed after
// stalling; the writer sees it on its stream.
TEST_F(ServiceTest, StalledPutIsReclaimedAndItsStreamAborted) {
  ServerOptions o;
  o.index.put_timeout = absl::Seconds(10);
  TearDown();
  server_.reset();
  Start(o);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::PutResponse resp;
  auto writer = stub_->Put(&ctx, &resp);
  v1::PutRequest header;
  *header.mutable_header() = Header(ns_, 1 << 20);
  ASSERT_TRUE(writer->Write(header));
  v1::PutRequest chunk;
  chunk.mutable_chunk()->set_offset(0);
  chunk.mutable_chunk()->set_data(Bytes(1000, 1));
  ASSERT_TRUE(writer->Write(chunk));
  // Wait until the server holds the reservation, then let it stall.
  ASSERT_TRUE(WaitFor([&] { return server_->store().Stats().states.reserved_bytes == 1 << 20; }))
      << "reserved " << server_->store().Stats().states.reserved_bytes;
  clock_.Advance(absl::Seconds(11));
  server_->ReapOnce();
  EXPECT_EQ(server_->store().Stats().states.reserved_bytes, 0);
  EXPECT_EQ(server_->store().Stats().expired_puts, 1);
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  // ABORTED, as reclaimed: by the reaper's cancel ("put reclaimed: no progress
  // for put_timeout (10s)"), or, when the reap came between the server's
  // reservation and its registration of the stream, by the chunk's write into
  // the reclaimed reservation ("the put was reclaimed (timed out, ...)"; seen
  // once under ASan).
  EXPECT_TRUE(HasStatus(s, grpc::StatusCode::ABORTED, "reclaimed")) << s.error_message();
}

// grpc.health.v1.Health/Check over a generic stub: the request is an empty
// HealthCheckRequest (service ""), the response `status = 1` (SERVING) encodes
// as the bytes 0x08 0x01.
TEST_F(ServiceTest, HealthServiceReportsServing) {
  grpc::GenericStub stub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  grpc::ByteBuffer request, response;
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

}  // namespace
}  // namespace hybridserve::cachestore
