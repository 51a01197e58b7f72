// The transfer ticket on the wire: each data plane's kind and what it needs.

#include "prefill/wire.h"

#include <string>

#include "absl/time/clock.h"
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
  return t;
}

TEST(TicketWireTest, TcpAndNcclTicketsRoundTripWithTheirKind) {
  for (transport::TransportKind kind :
       {transport::TransportKind::kTcp, transport::TransportKind::kNccl, transport::TransportKind::kCudaIpc}) {
    transport::Ticket t = ATicket();
    t.kind = kind;
    if (kind == transport::TransportKind::kNccl) t.channel_id = std::string(transport::kNcclUniqueIdBytes, 'x');
    if (kind == transport::TransportKind::kCudaIpc)
      t.channel_id = "127.0.0.1:4000/00112233445566778899aabbccddeeff";
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
