// The transfer ticket on the wire: each data plane's kind and what it needs.

#include "prefill/prefill_proto.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cancellation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/transfer.h"

namespace hybridserve::prefill {
namespace {

using ::testing::HasSubstr;

transport::Ticket ATicket() {
  transport::Ticket t;
  t.transfer_id = 17;
  t.endpoint = "10.0.0.2:7000";
  t.n_tokens = 70;
  t.page_format = common::Hash128{3, 4};
  t.num_pages = 4;
  t.page_bytes = 4096;
  t.max_state_bytes = 100000;
  t.page_slots = {9, 2, 5, 7};
  t.state_slot = 3;
  t.deadline = absl::FromUnixSeconds(2000000000) + absl::Nanoseconds(123);
  t.secret = std::string("\x00\x01secret-bytes\xfe\xff", 16);
  return t;
}

TEST(TicketWireTest, TcpAndNcclTicketsRoundTripWithTheirKind) {
  for (transport::TransportKind kind :
       {transport::TransportKind::kTcp, transport::TransportKind::kNccl, transport::TransportKind::kCudaIpc}) {
    transport::Ticket t = ATicket();
    t.kind = kind;
    if (kind == transport::TransportKind::kNccl) t.channel_id = std::string(transport::kNcclUniqueIdBytes, 'x');
    if (kind == transport::TransportKind::kCudaIpc) t.channel_id = "127.0.0.1:4000/00112233445566778899aabbccddeeff";
    v1::TransferTicket p;
    TicketToProto(t, &p);
    EXPECT_EQ(p.transport(), kind == transport::TransportKind::kTcp    ? v1::TRANSPORT_KIND_TCP
                             : kind == transport::TransportKind::kNccl ? v1::TRANSPORT_KIND_NCCL
                                                                       : v1::TRANSPORT_KIND_CUDA_IPC);
    auto back = TicketFromProto(p);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->kind, kind);
    EXPECT_EQ(back->channel_id, t.channel_id);
    EXPECT_EQ(back->transfer_id, t.transfer_id);
    EXPECT_EQ(back->endpoint, t.endpoint);
    EXPECT_EQ(back->page_slots, t.page_slots);
    EXPECT_EQ(back->state_slot, t.state_slot);
    EXPECT_EQ(back->deadline, t.deadline);
    EXPECT_EQ(back->page_format, t.page_format);
    EXPECT_EQ(back->secret, t.secret);
    EXPECT_EQ(p.transfer_secret(), t.secret);
  }
}

// Pages decode already holds (transfer.h "Held pages"): up to every page of
// a TCP ticket; never more, never on a channel plane.
TEST(TicketWireTest, HeldPagesRoundTripOnTcpAndAreRefusedBeyondThePagesOrOnAChannel) {
  transport::Ticket t = ATicket();
  for (const int64_t held : {int64_t{0}, int64_t{3}, int64_t{4}}) {
    t.held_pages = held;
    v1::TransferTicket p;
    TicketToProto(t, &p);
    auto back = TicketFromProto(p);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->held_pages, held);
  }
  t.held_pages = 5;
  v1::TransferTicket p;
  TicketToProto(t, &p);
  EXPECT_THAT(std::string(TicketFromProto(p).status().message()), HasSubstr("ticket.held_pages 5 of 4"));
  t.held_pages = 1;
  t.kind = transport::TransportKind::kNccl;
  t.channel_id = std::string(transport::kNcclUniqueIdBytes, 'x');
  TicketToProto(t, &p);
  EXPECT_EQ(TicketFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TicketWireTest, ASecretThatIsNotSixteenBytesIsInvalidOnEveryKind) {
  for (transport::TransportKind kind :
       {transport::TransportKind::kTcp, transport::TransportKind::kNccl, transport::TransportKind::kCudaIpc}) {
    transport::Ticket t = ATicket();
    t.kind = kind;
    if (kind == transport::TransportKind::kNccl) t.channel_id = std::string(transport::kNcclUniqueIdBytes, 'x');
    if (kind == transport::TransportKind::kCudaIpc) t.channel_id = "127.0.0.1:4000/00112233445566778899aabbccddeeff";
    for (size_t bytes : {size_t{0}, size_t{15}, size_t{17}, size_t{32}}) {
      t.secret = std::string(bytes, 's');
      v1::TransferTicket p;
      TicketToProto(t, &p);
      const absl::Status s = TicketFromProto(p).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bytes << " bytes";
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr(absl::StrCat("ticket.transfer_secret must be 16 bytes, got ", bytes)));
    }
  }
}

TEST(TicketWireTest, EachKindIsRefusedWithoutWhatItNeeds) {
  transport::Ticket t = ATicket();
  t.kind = transport::TransportKind::kNccl;
  t.channel_id = "short";
  v1::TransferTicket p;
  TicketToProto(t, &p);
  auto s = TicketFromProto(p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nccl_unique_id must be 128 bytes"));

  p.set_transport(v1::TRANSPORT_KIND_TCP);
  s = TicketFromProto(p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("is set on a TCP ticket"));
  p.set_transport(v1::TRANSPORT_KIND_CUDA_IPC);  // a CUDA IPC ticket names its channel in cuda_ipc_channel
  EXPECT_EQ(TicketFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);

  for (v1::TransportKind kind : {v1::TRANSPORT_KIND_UNSPECIFIED, v1::TRANSPORT_KIND_IN_PROCESS}) {
    p.set_transport(kind);
    s = TicketFromProto(p).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("is not served by this worker"));
  }
  p.set_transport(static_cast<v1::TransportKind>(99));  // a kind from a newer peer
  EXPECT_EQ(TicketFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::prefill

namespace hybridserve::prefill {
namespace {

TEST(RequestProtoTest, RoundTripsWhatPrefillNeeds) {
  PrefillRequest r;
  r.request_id = "req-1";
  r.prompt = {5, 0, 9};
  r.cache_salt = "tenant";
  r.sampling.temperature = 0.5f;
  r.sampling.top_p = 0.75f;
  r.sampling.top_k = 3;
  r.sampling.seed = 0xfeedfacecafebeefULL;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 4;
  r.ticket = ATicket();
  r.ticket.kind = transport::TransportKind::kTcp;
  r.cancellation = std::make_shared<common::Cancellation>();  // stays behind
  v1::PrefillRequest p;
  RequestToProto(r, &p);
  EXPECT_EQ(p.protocol(), v1::PREFILL_PROTOCOL_V2);
  absl::StatusOr<PrefillRequest> back = RequestFromProto(p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->request_id, r.request_id);
  EXPECT_EQ(back->prompt, r.prompt);
  EXPECT_EQ(back->cache_salt, r.cache_salt);
  EXPECT_EQ(back->sampling.temperature, 0.5f);
  EXPECT_EQ(back->sampling.top_p, 0.75f);
  EXPECT_EQ(back->sampling.top_k, 3);
  EXPECT_EQ(back->sampling.seed, 0xfeedfacecafebeefULL);
  EXPECT_TRUE(back->sampling.logprobs);
  EXPECT_EQ(back->sampling.top_logprobs, 4);
  EXPECT_EQ(back->ticket.transfer_id, r.ticket.transfer_id);
  EXPECT_EQ(back->ticket.deadline, r.ticket.deadline);
  EXPECT_EQ(back->ticket.secret, r.ticket.secret);
  EXPECT_EQ(back->cancellation, nullptr);
}

// A version-1 caller (a decode worker of an older release) wrapped a client
// GenerateRequest in field 1 and named no protocol: refused, saying why.
TEST(RequestProtoTest, RefusesAnotherProtocolVersionNamingBoth) {
  PrefillRequest r;
  r.request_id = "old";
  r.prompt = {1};
  r.ticket = ATicket();
  r.ticket.kind = transport::TransportKind::kTcp;
  v1::PrefillRequest p;
  RequestToProto(r, &p);
  p.clear_protocol();
  absl::Status s = RequestFromProto(p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("prefill protocol 1 is not spoken here"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("speaks protocol 2"));
}

TEST(RequestProtoTest, RefusesWhatCannotBeRepresented) {
  PrefillRequest r;
  r.request_id = std::string(769, 'x');  // the client's 256, or an earlier decode's tenant-scoped form: at most 768
  r.prompt = {1};
  r.ticket = ATicket();
  r.ticket.kind = transport::TransportKind::kTcp;
  v1::PrefillRequest p;
  RequestToProto(r, &p);
  EXPECT_EQ(RequestFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);
  p.set_request_id(std::string(768, 'x'));
  EXPECT_TRUE(RequestFromProto(p).ok());
  p.set_tenant(std::string(257, 't'));
  EXPECT_THAT(std::string(RequestFromProto(p).status().message()), HasSubstr("tenant has 257 bytes"));
  p.set_tenant("spiffe://example/tenant");
  EXPECT_EQ(RequestFromProto(p)->tenant, "spiffe://example/tenant");
  p.set_request_id("ok");
  p.mutable_sampling()->set_top_logprobs(21);
  absl::Status s = RequestFromProto(p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("sampling.top_logprobs 21"));
}

}  // namespace
}  // namespace hybridserve::prefill
