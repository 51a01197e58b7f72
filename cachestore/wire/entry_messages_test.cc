#include "cachestore/wire/entry_messages.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/cachestore.pb.h"

namespace hybridserve::cachestore::entry_messages {
namespace {

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a message of `pieces` slices cut at random places (a receiver
// sees a message as whatever slices the transport made).
grpc::ByteBuffer Split(const std::string& bytes, int pieces, std::mt19937& rng) {
  std::vector<size_t> cuts = {0, bytes.size()};
  for (int i = 1; i < pieces; ++i) cuts.push_back(bytes.empty() ? 0 : rng() % (bytes.size() + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) slices.emplace_back(bytes.data() + cuts[i], cuts[i + 1] - cuts[i]);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The data field, read both ways (copied out, appended), which must agree.
std::string DataOf(const DecodedChunk& d) {
  std::string out(d.data_size(), '\0');
  d.CopyData(reinterpret_cast<uint8_t*>(out.data()));
  std::string appended = "x";
  d.AppendData(&appended);
  EXPECT_EQ(appended.substr(1), out);
  return out;
}

std::string Payload(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// What we send is what protobuf's generated code parses, field for field.
TEST(EntryMessagesTest, EncodedMessagesParseAsTheGeneratedCodeReadsThem) {
  const std::string data = Payload(70000, 1);
  auto owner = std::make_shared<std::string>(data);
  const grpc::Slice borrowed = BorrowedSlice(owner->data(), owner->size(), owner);

  v1::GetResponse get;
  ASSERT_TRUE(get.ParseFromString(Flatten(
      EncodeChunk({{kGetSizeBytes, 1u << 30}, {kGetChecksum, ~uint64_t{0}}, {kGetOffset, 0}}, kGetData, borrowed))));
  EXPECT_EQ(get.size_bytes(), 1u << 30);
  EXPECT_EQ(get.checksum(), ~uint64_t{0});
  EXPECT_EQ(get.offset(), 0u);
  EXPECT_TRUE(get.data() == data);

  v1::GetManyResponse many;
  ASSERT_TRUE(many.ParseFromString(Flatten(EncodeChunk(
      {{kManyIndex, 4095}, {kManySizeBytes, 0}, {kManyChecksum, 7}, {kManyOffset, 123456789}}, kManyData, borrowed))));
  EXPECT_EQ(many.index(), 4095u);
  EXPECT_EQ(many.checksum(), 7u);
  EXPECT_EQ(many.offset(), 123456789u);
  EXPECT_TRUE(many.data() == data);

  v1::PutRequest put;
  ASSERT_TRUE(put.ParseFromString(Flatten(EncodeChunk({{kChunkOffset, 1u << 22}}, kChunkData, borrowed, kPutChunk))));
  ASSERT_EQ(put.message_case(), v1::PutRequest::kChunk);
  EXPECT_EQ(put.chunk().offset(), 1u << 22);
  EXPECT_TRUE(put.chunk().data() == data);

  // An empty chunk is an empty field set, as protobuf writes it.
  v1::GetResponse empty_in;
  empty_in.set_offset(5);
  EXPECT_EQ(Flatten(EncodeChunk({{kGetOffset, 5}}, kGetData, grpc::Slice())), empty_in.SerializeAsString());
  // And byte for byte what protobuf writes for a non-empty one.
  v1::GetManyResponse canonical;
  canonical.set_index(3);
  canonical.set_offset(9);
  canonical.set_data("abc");
  EXPECT_EQ(Flatten(EncodeChunk({{kManyIndex, 3}, {kManyOffset, 9}}, kManyData, grpc::Slice(std::string("abc")))),
            canonical.SerializeAsString());
}

// What protobuf sends, we read: every message cut into slices anywhere.
TEST(EntryMessagesTest, DecodesWhatTheGeneratedCodeWritesWhateverItsSlices) {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    v1::GetManyResponse m;
    m.set_index(rng() % 5000);
    m.set_size_bytes(rng());
    m.set_checksum((uint64_t{rng()} << 32) | rng());
    m.set_offset(rng() % 3 == 0 ? 0 : rng());
    m.set_data(Payload(rng() % 3000, round));
    DecodedChunk d;
    ASSERT_TRUE(DecodeChunk(Split(m.SerializeAsString(), 1 + round % 9, rng), kManyData, 0, &d).ok());
    EXPECT_EQ(d.field(kManyIndex), m.index());
    EXPECT_EQ(d.field(kManySizeBytes), m.size_bytes());
    EXPECT_EQ(d.field(kManyChecksum), m.checksum());
    EXPECT_EQ(d.field(kManyOffset), m.offset());
    EXPECT_EQ(DataOf(d), m.data()) << "round " << round;

    v1::PutRequest p;
    p.mutable_chunk()->set_offset(rng());
    p.mutable_chunk()->set_data(Payload(rng() % 3000, round + 1000));
    ASSERT_TRUE(DecodeChunk(Split(p.SerializeAsString(), 1 + round % 5, rng), kChunkData, kPutChunk, &d).ok());
    EXPECT_EQ(d.field(kChunkOffset), p.chunk().offset());
    EXPECT_EQ(DataOf(d), p.chunk().data());
  }
}

// Protobuf's rules for what a sender may legally do: fields in any order,
// the last scalar wins, an embedded message given twice merges, unknown
// fields are skipped. Each case is checked against the generated parser.
TEST(EntryMessagesTest, FollowsProtobufsRulesForLegalButUnusualEncodings) {
  std::vector<std::string> cases;
  {
    v1::PutRequest a, b;
    a.mutable_chunk()->set_offset(10);
    a.mutable_chunk()->set_data("first");
    b.mutable_chunk()->set_data("second");  // merged: offset 10 stays, data replaced
    cases.push_back(a.SerializeAsString() + b.SerializeAsString());
    b.mutable_chunk()->set_offset(20);
    cases.push_back(a.SerializeAsString() + b.SerializeAsString());
  }
  {
    // Data before the scalars, a scalar twice, unknown fields of every wire type.
    std::string m;
    m += "\x22\x03xyz";                                 // field 4 (data), "xyz"
    m += std::string("\x18\x05");                       // offset 5
    m += std::string("\x18\x07");                       // offset 7: the last wins
    m += std::string("\x48\x01");                       // unknown varint field 9
    m += std::string("\x51") + std::string(8, '\x01');  // unknown fixed64 field 10
    m += std::string("\x5d") + std::string(4, '\x02');  // unknown fixed32 field 11
    m += "\x62\x02hi";                                  // unknown bytes field 12
    m += "\x22\x02zz";                                  // data again: the last wins
    cases.push_back(m);
  }
  for (const std::string& bytes : cases) {
    const bool put = bytes[0] == '\x12';
    DecodedChunk d;
    std::mt19937 rng(1);
    ASSERT_TRUE(DecodeChunk(Split(bytes, 3, rng), put ? kChunkData : kGetData, put ? kPutChunk : 0, &d).ok());
    if (put) {
      v1::PutRequest p;
      ASSERT_TRUE(p.ParseFromString(bytes));
      EXPECT_EQ(d.field(kChunkOffset), p.chunk().offset());
      EXPECT_EQ(DataOf(d), p.chunk().data());
    } else {
      v1::GetResponse g;
      ASSERT_TRUE(g.ParseFromString(bytes));
      EXPECT_EQ(d.field(kGetOffset), g.offset());
      EXPECT_EQ(DataOf(d), g.data());
    }
  }
}

// A put message that is not a plain chunk (a header, a commit, or anything
// beside the chunk) is FAILED_PRECONDITION: the receiver decodes it with
// protobuf. Truncations are INVALID_ARGUMENT.
TEST(EntryMessagesTest, RefusesWhatIsNotAPlainChunkAndWhatIsMalformed) {
  v1::PutRequest header;
  header.mutable_header()->set_size_bytes(5);
  v1::PutRequest commit;
  commit.mutable_commit()->set_checksum(9);
  v1::PutRequest chunk;
  chunk.mutable_chunk()->set_data("abcdef");
  DecodedChunk d;
  std::mt19937 rng(3);
  for (const std::string& bytes : {std::string(), header.SerializeAsString(), commit.SerializeAsString(),
                                   chunk.SerializeAsString() + commit.SerializeAsString()}) {
    EXPECT_EQ(DecodeChunk(Split(bytes, 2, rng), kChunkData, kPutChunk, &d).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  const std::string whole = chunk.SerializeAsString();
  for (size_t cut = 1; cut < whole.size(); ++cut) {
    EXPECT_EQ(DecodeChunk(Split(whole.substr(0, cut), 2, rng), kChunkData, kPutChunk, &d).code(),
              absl::StatusCode::kInvalidArgument)
        << "cut at " << cut;
  }
}

// Whatever bytes arrive, a message we accept is one protobuf accepts and
// reads the same way (the converse need not hold: we refuse some encodings
// protobuf would take, and the receiver then falls back to protobuf).
TEST(EntryMessagesTest, RandomBytesAreEitherRefusedOrReadAsProtobufReadsThem) {
  std::mt19937 rng(11);
  int accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string bytes(rng() % 24, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? 0x22 : rng());
    DecodedChunk d;
    if (!DecodeChunk(Split(bytes, 1 + round % 4, rng), kGetData, 0, &d).ok()) continue;
    ++accepted;
    v1::GetResponse g;
    ASSERT_TRUE(g.ParseFromString(bytes)) << "accepted what protobuf refuses, round " << round;
    EXPECT_EQ(d.field(kGetSizeBytes), g.size_bytes());
    EXPECT_EQ(d.field(kGetChecksum), g.checksum());
    EXPECT_EQ(d.field(kGetOffset), g.offset());
    EXPECT_EQ(DataOf(d), g.data());
  }
  EXPECT_GT(accepted, 100);  // the comparison above ran
}

}  // namespace
}  // namespace hybridserve::cachestore::entry_messages
