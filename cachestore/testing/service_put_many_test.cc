// PutMany over real gRPC on loopback: answers in order, malformed streams
// ended naming the entry, a stalled stream reclaimed (the PutMany rows of
// service_test.cc's status table).

#include <string>
#include <vector>

#include "cachestore/testing/service_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

using common::WaitFor;
using ::testing::HasSubstr;

// Sends `messages` on a raw PutMany stream; the answers read, and the final
// status.
struct PutManyOutcome {
  std::vector<v1::PutManyResponse> answers;
  grpc::Status status;
};
PutManyOutcome RawPutMany(v1::CacheStore::Stub& stub, const std::vector<v1::PutRequest>& messages) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = stub.PutMany(&ctx);
  for (const auto& m : messages) {
    if (!stream->Write(m)) break;
  }
  stream->WritesDone();
  PutManyOutcome out;
  v1::PutManyResponse a;
  while (stream->Read(&a)) out.answers.push_back(a);
  out.status = stream->Finish();
  return out;
}

TEST_F(ServiceTest, PutManyAnswersEntriesInOrderAndDropsTheRestOfAnAnsweredOne) {
  std::string bytes = Bytes(10000, 3);
  const uint64_t sum = common::Checksum64(bytes.data(), bytes.size());
  v1::PutRequest header, chunk, commit, bad_commit;
  *header.mutable_header() = Header(ns_, bytes.size());
  chunk.mutable_chunk()->set_data(bytes);
  commit.mutable_commit()->set_checksum(sum);
  bad_commit.mutable_commit()->set_checksum(sum + 1);
  v1::PutRequest other = header, orphan = header;
  other.mutable_header()->set_token_ids(0, 6);
  orphan.mutable_header()->set_parent_key(Hash128{5, 6}.ToBytes());
  // 0: created; 1: already present, its bytes and commit dropped; 2: refused
  // at its header, its bytes dropped, no commit; 3: DATA_LOSS; 4: created.
  PutManyOutcome out = RawPutMany(*stub_, {header, chunk, commit, header, chunk, commit, orphan, chunk, other, chunk,
                                           bad_commit, other, chunk, commit});
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.answers.size(), 5u);
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(out.answers[i].index(), i);
  EXPECT_EQ(out.answers[0].code(), 0);
  EXPECT_FALSE(out.answers[0].result().already_present());
  EXPECT_EQ(out.answers[1].code(), 0);
  EXPECT_TRUE(out.answers[1].result().already_present());
  EXPECT_EQ(out.answers[2].code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(out.answers[2].message(), HasSubstr("is not in the cache"));
  EXPECT_EQ(out.answers[3].code(), static_cast<int>(grpc::StatusCode::DATA_LOSS));
  EXPECT_THAT(out.answers[3].message(), HasSubstr("checksum mismatch"));
  EXPECT_EQ(out.answers[4].code(), 0);
  EXPECT_EQ(out.answers[4].result().key().size(), 16u);
  IndexStats st = server_->store().Stats();
  EXPECT_EQ(st.states.entries, 2);
  EXPECT_EQ(st.states.reserved_bytes, 0);
}

TEST_F(ServiceTest, MalformedPutManyStreamsEndNamingTheEntry) {
  std::string bytes = Bytes(10000, 3);
  const uint64_t sum = common::Checksum64(bytes.data(), bytes.size());
  auto chunk = [&](uint64_t off, size_t n) { return ChunkOf(bytes, off, n); };
  v1::PutRequest header, commit;
  *header.mutable_header() = Header(ns_, bytes.size());
  commit.mutable_commit()->set_checksum(sum);
  v1::PutRequest other = header;
  other.mutable_header()->set_token_ids(0, 6);
  auto status = [&](const std::vector<v1::PutRequest>& m) { return RawPutMany(*stub_, m).status; };
  EXPECT_TRUE(HasStatus(status({chunk(0, 100)}), grpc::StatusCode::INVALID_ARGUMENT,
                        "put_many entry 0: a chunk outside an entry"));
  EXPECT_TRUE(HasStatus(status({commit}), grpc::StatusCode::INVALID_ARGUMENT, "a commit outside an entry"));
  EXPECT_TRUE(HasStatus(status({header, chunk(0, 10000), commit, other, chunk(0, 10), header}),
                        grpc::StatusCode::INVALID_ARGUMENT, "put_many entry 1: a header before the entry's commit"));
  EXPECT_TRUE(HasStatus(status({other, chunk(0, 5000)}), grpc::StatusCode::INVALID_ARGUMENT,
                        "put_many entry 0: stream ended before its commit: 5000 of 10000 bytes arrived"));
  EXPECT_TRUE(HasStatus(status({other, chunk(5000, 5000)}), grpc::StatusCode::INVALID_ARGUMENT,
                        "out of order: expected offset 0"));
  EXPECT_TRUE(HasStatus(status({other, chunk(0, 5000), commit}), grpc::StatusCode::INVALID_ARGUMENT,
                        "put ended early: 5000 of 10000 bytes arrived"));
  // The entry the first stream committed stays; nothing else was left behind.
  IndexStats s = server_->store().Stats();
  EXPECT_EQ(s.states.entries, 1);
  EXPECT_EQ(s.states.reserved_bytes + s.pages.reserved_bytes, 0);
  EXPECT_EQ(s.active_puts, 0);
}

TEST_F(ServiceTest, StalledPutManyIsReclaimedAndItsStreamAborted) {
  ServerOptions o;
  o.index.put_timeout = absl::Seconds(10);
  TearDown();
  server_.reset();
  Start(o);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = stub_->PutMany(&ctx);
  const std::string bytes = Bytes(1000, 1);
  v1::PutRequest header, chunk, commit;
  *header.mutable_header() = Header(ns_, bytes.size());
  chunk.mutable_chunk()->set_data(bytes);
  commit.mutable_commit()->set_checksum(common::Checksum64(bytes.data(), bytes.size()));
  v1::PutRequest stalled = header;
  stalled.mutable_header()->set_token_ids(0, 6);
  stalled.mutable_header()->set_size_bytes(1 << 20);
  // The stalled entry gets its header and nothing more: a chunk still in
  // flight when the reaper runs could meet the reclaimed put first, and be
  // answered ABORTED for that entry (the stream going on) instead.
  for (const v1::PutRequest& m : {header, chunk, commit, stalled}) ASSERT_TRUE(stream->Write(m));
  v1::PutManyResponse first;
  ASSERT_TRUE(stream->Read(&first));
  EXPECT_EQ(first.code(), 0);
  ASSERT_TRUE(WaitFor([&] { return server_->store().Stats().states.reserved_bytes == 1 << 20; }));
  clock_.Advance(absl::Seconds(11));
  server_->ReapOnce();
  EXPECT_EQ(server_->store().Stats().states.reserved_bytes, 0);
  v1::PutManyResponse more;
  EXPECT_FALSE(stream->Read(&more));
  EXPECT_TRUE(HasStatus(stream->Finish(), grpc::StatusCode::ABORTED,
                        "put_many entry 1 reclaimed: no progress for put_timeout (10s)"));
  EXPECT_EQ(server_->store().Stats().states.entries, 1);
}

}  // namespace
}  // namespace hybridserve::cachestore
