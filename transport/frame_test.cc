#include "transport/frame.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::transport {
namespace {

using ::testing::HasSubstr;

TEST(FrameTest, HeaderRoundTripsAndPinsItsLayout) {
  const std::string payload = "page bytes";
  const std::string h = EncodeFrameHeader(FrameType::kPage, 0x1122334455667788u, 7, payload);
  ASSERT_EQ(h.size(), kFrameHeaderBytes);
  EXPECT_EQ(h.substr(0, 4), "HSXF");
  EXPECT_EQ(h[4], 2);  // version, little-endian
  EXPECT_EQ(h[6], 2);  // type kPage
  EXPECT_EQ(static_cast<unsigned char>(h[8]), 0x88);
  EXPECT_EQ(h[16], 7);
  EXPECT_EQ(h[24], static_cast<char>(payload.size()));
  auto d = DecodeFrameHeader(h);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->type, FrameType::kPage);
  EXPECT_EQ(d->transfer_id, 0x1122334455667788u);
  EXPECT_EQ(d->index, 7u);
  EXPECT_EQ(d->payload_bytes, payload.size());
  EXPECT_TRUE(CheckPayload(*d, payload).ok());
}

// A header of `version` with a valid checksum (what a sender of that
// version writes).
std::string HeaderOfVersion(uint16_t version, FrameType type, uint64_t id, absl::string_view payload) {
  std::string h = EncodeFrameHeader(type, id, 0, payload);
  std::memcpy(h.data() + 4, &version, sizeof(version));
  const uint64_t sum = common::Checksum64(h.data(), 40);
  std::memcpy(h.data() + 40, &sum, sizeof(sum));
  return h;
}

TEST(FrameTest, AVersionOneFrameIsRefusedByName) {
  // A version 1 begin: 48 payload bytes, no secret.
  const std::string v1 = HeaderOfVersion(1, FrameType::kBegin, 5, std::string(48, '\0'));
  auto d = DecodeFrameHeader(v1);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("frame version 1 (a sender without ticket secrets"));
  EXPECT_THAT(d.status().message(), HasSubstr("this build speaks frame version 2"));
  const auto v3 = DecodeFrameHeader(HeaderOfVersion(3, FrameType::kBegin, 5, ""));
  EXPECT_EQ(v3.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v3.status().message(), HasSubstr("frame version 3, this build speaks 2"));
  EXPECT_TRUE(DecodeFrameHeader(HeaderOfVersion(2, FrameType::kBegin, 5, "")).ok());
}

TEST(FrameTest, AnyCorruptedHeaderByteIsDataLoss) {
  const std::string h = EncodeFrameHeader(FrameType::kBegin, 5, 0, "x");
  for (size_t i = 0; i < h.size(); ++i) {
    std::string bad = h;
    bad[i] ^= 0x10;
    EXPECT_EQ(DecodeFrameHeader(bad).status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
  }
  EXPECT_EQ(DecodeFrameHeader(h.substr(1)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FrameTest, PayloadOfAnotherSizeOrContentIsDataLoss) {
  const std::string payload(1000, 'a');
  auto d = DecodeFrameHeader(EncodeFrameHeader(FrameType::kState, 1, 0, payload));
  ASSERT_TRUE(d.ok());
  std::string bad = payload;
  bad[999] = 'b';
  EXPECT_THAT(CheckPayload(*d, bad).message(), HasSubstr("checksum mismatch"));
  EXPECT_EQ(CheckPayload(*d, payload.substr(1)).code(), absl::StatusCode::kDataLoss);
}

// A source of `pages` pages of `page_bytes` bytes and the state `state`.
class SizedSource final : public StateSource {
 public:
  SizedSource(int64_t pages, int64_t page_bytes, std::string state)
      : pages_(pages), page_bytes_(page_bytes), state_(std::move(state)) {}
  int64_t num_pages() const override { return pages_; }
  int64_t page_bytes() const override { return page_bytes_; }
  absl::Status ReadPage(int64_t, absl::Span<char> out) const override {
    std::fill(out.begin(), out.end(), 'p');
    return absl::OkStatus();
  }
  absl::string_view state() const override { return state_; }
  int32_t first_token() const override { return 7; }
  float first_logprob() const override { return -0.5f; }

 private:
  int64_t pages_;
  int64_t page_bytes_;
  std::string state_;
};

// What every sender announces: the ticket's tokens, page format and secret,
// the source's pages and state size; the receiver's check accepts it.
TEST(FrameTest, BeginOfAnnouncesTheTicketAndTheSource) {
  Ticket ticket;
  ticket.transfer_id = 9;
  ticket.n_tokens = 100;
  ticket.page_format = common::Hash128{3, 4};
  ticket.num_pages = 6;
  ticket.page_bytes = 512;
  ticket.max_state_bytes = 4096;
  ticket.held_pages = 2;
  ticket.secret = "fedcba9876543210";
  const SizedSource source(6, 512, std::string(1234, 's'));
  const BeginPayload b = BeginOf(ticket, source);
  EXPECT_EQ(b.n_tokens, 100);
  EXPECT_EQ(b.page_format, (common::Hash128{3, 4}));
  EXPECT_EQ(b.num_pages, 6);
  EXPECT_EQ(b.page_bytes, 512);
  EXPECT_EQ(b.state_bytes, 1234);
  EXPECT_EQ(b.secret, "fedcba9876543210");
  EXPECT_TRUE(CheckBeginAgainstTicket(ticket.transfer_id, b, ticket).ok());
  // A source that differs from its ticket is announced as it is, and refused.
  const SizedSource other(5, 512, "s");
  EXPECT_EQ(BeginOf(ticket, other).num_pages, 5);
  EXPECT_EQ(CheckBeginAgainstTicket(ticket.transfer_id, BeginOf(ticket, other), ticket).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FrameTest, BeginEndAndAckRoundTrip) {
  BeginPayload b;
  b.n_tokens = 4097;
  b.page_format = common::Hash128{11, 22};
  b.num_pages = 256;
  b.page_bytes = 65536;
  b.state_bytes = 123456;
  b.secret = "0123456789abcdef";
  const std::string eb = EncodeBegin(b);
  ASSERT_EQ(eb.size(), kBeginPayloadBytes);
  ASSERT_EQ(kBeginPayloadBytes, 64u);
  EXPECT_EQ(eb.substr(48), "0123456789abcdef");  // the layout: the secret at 48
  auto db = DecodeBegin(eb);
  ASSERT_TRUE(db.ok());
  EXPECT_EQ(db->n_tokens, 4097);
  EXPECT_EQ(db->page_format, (common::Hash128{11, 22}));
  EXPECT_EQ(db->num_pages, 256);
  EXPECT_EQ(db->page_bytes, 65536);
  EXPECT_EQ(db->state_bytes, 123456);
  EXPECT_EQ(db->secret, "0123456789abcdef");
  EXPECT_EQ(DecodeBegin(eb.substr(1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeBegin(eb.substr(0, 48)).status().code(), absl::StatusCode::kInvalidArgument);  // version 1's size
  // A secret of another length is zero-padded or cut to 16 bytes.
  b.secret = "short";
  EXPECT_EQ(DecodeBegin(EncodeBegin(b))->secret, std::string("short") + std::string(11, '\0'));
  b.secret = std::string(40, 's');
  EXPECT_EQ(DecodeBegin(EncodeBegin(b))->secret, std::string(16, 's'));

  auto de = DecodeEnd(EncodeEnd(EndPayload{42, -0.25f}));
  ASSERT_TRUE(de.ok());
  EXPECT_EQ(de->first_token, 42);
  EXPECT_EQ(de->first_logprob, -0.25f);

  absl::Status carried = absl::UnknownError("unset");
  ASSERT_TRUE(DecodeAck(EncodeAck(absl::OkStatus()), &carried).ok());
  EXPECT_TRUE(carried.ok());
  ASSERT_TRUE(DecodeAck(EncodeAck(absl::DataLossError("page 3 checksum")), &carried).ok());
  EXPECT_EQ(carried.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(carried.message(), "page 3 checksum");
  const std::string long_message(5000, 'm');
  EXPECT_EQ(EncodeAck(absl::InternalError(long_message)).size(), 4 + kMaxAckMessage);
  std::string unknown = EncodeAck(absl::OkStatus());
  unknown[0] = 99;
  EXPECT_EQ(DecodeAck(unknown, &carried).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeAck("ab", &carried).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(carried.code(), absl::StatusCode::kDataLoss);  // unchanged by the malformed ones
}

}  // namespace
}  // namespace hybridserve::transport
