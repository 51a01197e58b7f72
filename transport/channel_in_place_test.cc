// The channel data plane's pages in place (channel_protocol.h): region
// offers, sinks, the sampled pages' checksums, and faults mid-pages, over
// the in-memory fake communicator with host buffers standing for device
// memory (channel_test_fixture.h); then the engine end to end, from the
// prefill pool into the decode reservation's slots.

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/hash.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/channel_receiver.h"
#include "transport/channel_sender.h"
#include "transport/channel_test_fixture.h"
#include "transport/engine_import.h"
#include "transport/engine_pair_test_util.h"
#include "transport/fake_communicator.h"

namespace hybridserve::transport {
namespace {

using ::testing::HasSubstr;

TEST_F(ChannelTransportTest, PagesOfferedInPlaceLandInTheSinkWithTheSampledPagesChecksums) {
  RandomSource source(21);
  source.split = {400, 600};
  std::vector<std::string> slots = EmptySlots();
  const Ticket t = Expect(30, absl::Seconds(30), std::make_unique<HostSink>(&slots, source.split));
  auto [sent, received] = Transfer(t, source);
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_TRUE(received->pages_in_place);
  EXPECT_EQ(received->num_pages_in_place, kPages);
  EXPECT_EQ(received->pages.size(), 0);
  EXPECT_EQ(slots, source.pages());
  // kPages = 4: pages 0 and 3 (the last) are sampled.
  ASSERT_EQ(received->page_checksums.size(), 2u);
  EXPECT_EQ(received->page_checksums[0].page, 0);
  EXPECT_EQ(received->page_checksums[0].checksum, common::Checksum64(source.pages()[0].data(), kPageBytes));
  EXPECT_EQ(received->page_checksums[1].page, 3);
  EXPECT_EQ(received->page_checksums[1].checksum, common::Checksum64(source.pages()[3].data(), kPageBytes));
  EXPECT_EQ(received->state, source.state());
  EXPECT_EQ(received->first_token, 4242);
  // The next transfer on the channel, staged, is in step.
  const RandomSource staged(22);
  const Ticket next = Expect(31);
  auto [sent2, received2] = Transfer(next, staged);
  ASSERT_TRUE(sent2.ok() && received2.ok()) << sent2 << received2.status();
  EXPECT_FALSE(received2->pages_in_place);
  ExpectIdentical(*received2, staged);
  EXPECT_EQ(factory_.links(), 1);
}

TEST_F(ChannelTransportTest, TheSamplingRuleChecksEverySixteenthPageAndTheLast) {
  EXPECT_EQ(SampledPages(0), 0);
  EXPECT_EQ(SampledPages(1), 1);
  EXPECT_EQ(SampledPages(16), 2);  // 0, 15
  EXPECT_EQ(SampledPages(17), 2);  // 0, 16
  EXPECT_EQ(SampledPages(18), 3);  // 0, 16, 17
  for (int64_t n : {1, 2, 15, 16, 17, 33, 100}) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) count += IsSampledPage(i, n) ? 1 : 0;
    EXPECT_EQ(count, SampledPages(n)) << n;
    EXPECT_TRUE(IsSampledPage(n - 1, n));
  }
}

TEST_F(ChannelTransportTest, AnOfferWithoutASinkAndASinkWithoutAnOfferTravelStaged) {
  RandomSource offering(23);
  offering.split = {1000};
  const Ticket t = Expect(32);
  auto [sent, received] = Transfer(t, offering);
  ASSERT_TRUE(sent.ok() && received.ok()) << sent << received.status();
  EXPECT_FALSE(received->pages_in_place);
  ExpectIdentical(*received, offering);

  const RandomSource plain(24);
  std::vector<std::string> slots = EmptySlots();
  const Ticket u = Expect(33, absl::Seconds(30), std::make_unique<HostSink>(&slots, std::vector<int64_t>{1000}));
  auto [sent2, received2] = Transfer(u, plain);
  ASSERT_TRUE(sent2.ok() && received2.ok()) << sent2 << received2.status();
  EXPECT_FALSE(received2->pages_in_place);
  ExpectIdentical(*received2, plain);
  EXPECT_EQ(slots, EmptySlots());  // nothing written into the slots
}

TEST_F(ChannelTransportTest, ARegionSplitMismatchIsRefusedBeforeAnyPageMoves) {
  RandomSource source(25);
  source.split = {400, 600};
  std::vector<std::string> slots = EmptySlots();
  const Ticket t = Expect(34, absl::Seconds(30), std::make_unique<HostSink>(&slots, std::vector<int64_t>{500, 500}));
  // Were the sender let past the verdict, its first region would break the channel.
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kBreak, /*from_rank=*/1, /*message=*/2).ok());
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(received.status().message(), HasSubstr("regions (400,600)"));
  EXPECT_THAT(received.status().message(), HasSubstr("(500,500)"));
  EXPECT_EQ(receiver_->refused(), 1);
  EXPECT_EQ(receiver_->channels(), 1);  // in step, still live
  EXPECT_EQ(slots, EmptySlots());
}

TEST_F(ChannelTransportTest, ASourceWhoseRegionsDoNotSplitAPageFailsBeforeAnyMessage) {
  RandomSource source(26);
  source.split = {400, 500};
  const Ticket t = Expect(35);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kBreak, /*from_rank=*/1, /*message=*/0).ok());
  const absl::Status sent = sender_.Send(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument) << sent;
  EXPECT_EQ(receiver_->channels(), 1);  // nothing was sent
  EXPECT_EQ(sender_.channels(), 0);
}

TEST_F(ChannelTransportTest, ASenderDyingMidPagesInPlaceFailsBothSidesAndHandsTheSinkBack) {
  RandomSource source(27);
  source.split = {250, 250, 500};
  std::vector<std::string> slots = EmptySlots();
  const Ticket t = Expect(36, absl::Seconds(30), std::make_unique<HostSink>(&slots, source.split));
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kBreak, 1, /*message=*/2 + 3 * 2 + 1).ok());  // page 2, region 1
  const absl::Time start = absl::Now();
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kUnavailable) << received.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(slots[0], source.pages()[0]);  // what arrived before the break
  EXPECT_EQ(receiver_->pending(), 0);
  EXPECT_EQ(receiver_->channels(), 0);
}

TEST_F(ChannelTransportTest, AStallMidPagesInPlaceFailsBothSidesAfterTheIoTimeout) {
  MakeReceiver(absl::Milliseconds(300));
  RandomSource source(28);
  source.split = {1000};
  std::vector<std::string> slots = EmptySlots();
  const Ticket t = Expect(37, absl::Seconds(30), std::make_unique<HostSink>(&slots, source.split));
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kStall, 1, /*message=*/3).ok());  // page 1 never arrives
  const absl::Time start = absl::Now();
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(received.status().code(), absl::StatusCode::kUnavailable) << received.status();
  EXPECT_THAT(received.status().message(), HasSubstr("stalled"));
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Cancel while a region message is in flight returns only once that receive
// ended: the caller may then free the slots.
TEST_F(ChannelTransportTest, CancelWaitsForTheRegionInFlightBeforeHandingTheSlotsBack) {
  MakeReceiver(absl::Milliseconds(500));
  RandomSource source(29);
  source.split = {1000};
  std::vector<std::string> slots = EmptySlots();
  const Ticket t = Expect(38, absl::Seconds(30), std::make_unique<HostSink>(&slots, source.split));
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kStall, 1, /*message=*/3).ok());  // the receive of page 1 hangs
  absl::Status sent;
  std::thread sender([&] { sent = sender_.Send(t, source); });
  // Messages 0 and 1 (kBegin) and 2 (page 0) received; the receiver is
  // blocked in the receive of message 3, page 1, into slot 1.
  const absl::Status in_flight = factory_.AwaitReceiving(t.channel_id, /*rank=*/0, /*messages=*/3, absl::Seconds(10));
  const bool page_0_landed = in_flight.ok() && slots[0] == source.pages()[0];
  receiver_->Cancel(t.transfer_id);
  const bool still_receiving = factory_.Receiving(t.channel_id, /*rank=*/0);
  sender.join();
  ASSERT_TRUE(in_flight.ok()) << "the receive of page 1 never began: " << in_flight;
  EXPECT_TRUE(page_0_landed);
  EXPECT_FALSE(still_receiving) << "Cancel returned while a receive into the slots was in flight";
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(receiver_->pending(), 0);
}

// ---- The engine end to end over the fake channel ----

// The same, pages in place: from the prefill engine's pool straight into the
// decode engine's reserved slots (the CPU backend's pools are host memory,
// copied by the fake channel as NCCL and CUDA IPC copy device memory).
class ChannelInPlaceEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<EnginePair> engines = MakeEnginePair();
    ASSERT_TRUE(engines.ok()) << engines.status();
    engines_ = *std::move(engines);
    MakeReceiver(absl::Seconds(10));
    const int64_t vocab = engines_.weights->config().vocab_size;
    std::vector<engine::TokenId> tokens(static_cast<size_t>(kTokens));
    for (int64_t i = 0; i < kTokens; ++i) {
      tokens[static_cast<size_t>(i)] = static_cast<engine::TokenId>((i * 31 + 5) % vocab);
    }
    auto src = engines_.prefill->sequences().New();
    ASSERT_TRUE(src.ok());
    src_ = *src;
    ASSERT_TRUE(engines_.prefill->Prefill(src_, tokens).ok());
  }

  void MakeReceiver(absl::Duration io_timeout) {
    receiver_.reset();
    ChannelReceiverOptions o;
    o.io_timeout = io_timeout;
    o.default_peer = kPeer;
    auto r = ChannelStateReceiver::Create(factory_, o);
    ASSERT_TRUE(r.ok());
    receiver_ = *std::move(r);
  }

  // A reservation of kTokens on decode, its ticket expected (in place: as a
  // decode worker does, ExpectReservation; staged: ExpectFrom without a
  // sink), `before_send` run on the ticket, then the prefill sequence sent:
  // {Send's status, Await's result}.
  struct Run {
    engine::ImportReservation reservation;
    absl::Status sent;
    absl::StatusOr<ReceivedState> received;
  };
  Run Transfer(uint64_t id, bool in_place, const std::function<void(const Ticket&)>& before_send = nullptr) {
    Run run;
    engine::SequenceTable& table = engines_.decode->sequences();
    auto reservation = table.ReserveImport(kTokens);
    EXPECT_TRUE(reservation.ok()) << reservation.status();
    run.reservation = *reservation;
    auto ticket = TicketFor(table, *reservation, id, "decode-0", absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(ticket.ok());
    const absl::Status expected = in_place ? ExpectReservation(*receiver_, &*ticket, table, *reservation)
                                           : receiver_->ExpectFrom(kPeer, &*ticket);
    EXPECT_TRUE(expected.ok()) << expected;
    if (before_send) before_send(*ticket);
    auto source =
        SequenceStateSource::Create(engines_.prefill->sequences(), src_, *ticket, engines_.weights->fingerprint(),
                                    common::Hash128{}, /*first_token=*/17, /*first_logprob=*/-1.5f);
    EXPECT_TRUE(source.ok()) << source.status();
    std::thread sending([&] { run.sent = sender_.Send(*ticket, *source); });
    run.received = receiver_->Await(id);
    sending.join();
    return run;
  }

  // The decode engine's bytes of the imported sequence: its pages and state.
  std::vector<std::string> ImportedBytes(engine::SequenceId id) {
    std::vector<std::string> out;
    for (int64_t i = 0; i < kTokens / 16; ++i) out.push_back(*engines_.decode->sequences().ExportPage(id, i));
    std::string state;
    EXPECT_TRUE(engines_.decode->sequences()
                    .EncodeStateInto(id, true, engines_.weights->fingerprint(), common::Hash128{}, &state)
                    .ok());
    out.push_back(state);
    return out;
  }

  static constexpr int64_t kTokens = 150;  // 9 full pages (0 and 8 sampled) and a partial one
  EnginePair engines_;
  engine::SequenceId src_ = 0;
  FakeCommunicatorFactory factory_;
  ChannelStateSender sender_{factory_};
  std::unique_ptr<ChannelStateReceiver> receiver_;
};

TEST_F(ChannelInPlaceEngineTest, ASequenceSentInPlaceContinuesBitIdenticallyToTheSender) {
  Run run = Transfer(1, /*in_place=*/true);
  ASSERT_TRUE(run.sent.ok()) << run.sent;
  ASSERT_TRUE(run.received.ok()) << run.received.status();
  EXPECT_TRUE(run.received->pages_in_place);
  EXPECT_EQ(run.received->pages.size(), 0);
  EXPECT_EQ(run.received->page_checksums.size(), 2u);
  ASSERT_TRUE(ImportReceived(engines_.decode->sequences(), run.reservation, *run.received).ok());
  for (int step = 0; step < 4; ++step) {
    auto a = engines_.decode->DecodeStep({run.reservation.id}, {static_cast<engine::TokenId>(step + 2)});
    auto b = engines_.prefill->DecodeStep({src_}, {static_cast<engine::TokenId>(step + 2)});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << "step " << step;
  }
}

TEST_F(ChannelInPlaceEngineTest, StagedAndInPlaceImportTheSameBytes) {
  Run staged = Transfer(1, /*in_place=*/false);
  ASSERT_TRUE(staged.sent.ok() && staged.received.ok()) << staged.sent << staged.received.status();
  EXPECT_FALSE(staged.received->pages_in_place);
  ASSERT_TRUE(ImportReceived(engines_.decode->sequences(), staged.reservation, *staged.received).ok());
  Run in_place = Transfer(2, /*in_place=*/true);
  ASSERT_TRUE(in_place.sent.ok() && in_place.received.ok()) << in_place.sent << in_place.received.status();
  EXPECT_TRUE(in_place.received->pages_in_place);
  ASSERT_TRUE(ImportReceived(engines_.decode->sequences(), in_place.reservation, *in_place.received).ok());
  EXPECT_NE(staged.reservation.page_slots, in_place.reservation.page_slots);
  EXPECT_EQ(ImportedBytes(staged.reservation.id), ImportedBytes(in_place.reservation.id));
  for (int64_t i = 0; i < kTokens / 16; ++i) {
    EXPECT_EQ(*engines_.decode->sequences().ExportPage(in_place.reservation.id, i),
              *engines_.prefill->sequences().ExportPage(src_, i));
  }
}

TEST_F(ChannelInPlaceEngineTest, ASampledPageCorruptedOnTheLinkIsDataLossAndTheReservationIsReleased) {
  const int64_t free_pages = engines_.decode->sequences().num_free_pages();
  const int64_t free_slots = engines_.decode->sequences().num_free_slots();
  const int64_t regions = 2 * engines_.decode->sequences().layout().attention_layers;
  // Page 8, the last (sampled), region 1: message 2 + 8 * regions + 1.
  Run run = Transfer(1, /*in_place=*/true, [&](const Ticket& t) {
    FakeFault f;
    f.kind = FakeFault::Kind::kCorruptByte;
    f.from_rank = 1;
    f.message = 2 + 8 * regions + 1;
    f.byte = 5;
    ASSERT_TRUE(factory_.InjectFault(t.channel_id, f).ok());
  });
  ASSERT_TRUE(run.sent.ok()) << run.sent;  // the channel cannot see it
  ASSERT_TRUE(run.received.ok()) << run.received.status();
  const absl::Status imported = ImportReceived(engines_.decode->sequences(), run.reservation, *run.received);
  EXPECT_EQ(imported.code(), absl::StatusCode::kDataLoss) << imported;
  EXPECT_THAT(imported.message(), HasSubstr("page 8 landed in place"));
  EXPECT_EQ(engines_.decode->sequences().Find(run.reservation.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engines_.decode->sequences().num_free_pages(), free_pages);
  EXPECT_EQ(engines_.decode->sequences().num_free_slots(), free_slots);
  // The next transfer imports cleanly.
  Run next = Transfer(2, /*in_place=*/true);
  ASSERT_TRUE(next.sent.ok() && next.received.ok());
  EXPECT_TRUE(ImportReceived(engines_.decode->sequences(), next.reservation, *next.received).ok());
}

TEST_F(ChannelInPlaceEngineTest, APeerKilledMidPagesFailsBothSidesWithinTheIoTimeoutAndTheReservationAborts) {
  MakeReceiver(absl::Milliseconds(300));
  const int64_t free_pages = engines_.decode->sequences().num_free_pages();
  const int64_t free_slots = engines_.decode->sequences().num_free_slots();
  const int64_t regions = 2 * engines_.decode->sequences().layout().attention_layers;
  const absl::Time start = absl::Now();
  // The sender dies in the middle of page 4.
  Run run = Transfer(1, /*in_place=*/true, [&](const Ticket& t) {
    FakeFault f;
    f.kind = FakeFault::Kind::kBreak;
    f.from_rank = 1;
    f.message = 2 + 4 * regions + 1;
    ASSERT_TRUE(factory_.InjectFault(t.channel_id, f).ok());
  });
  EXPECT_EQ(run.sent.code(), absl::StatusCode::kUnavailable) << run.sent;
  EXPECT_EQ(run.received.status().code(), absl::StatusCode::kUnavailable) << run.received.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // What the decode loop does on failure: half-written slots go back unused.
  ASSERT_TRUE(engines_.decode->sequences().AbortImport(run.reservation.id).ok());
  EXPECT_EQ(engines_.decode->sequences().num_free_pages(), free_pages);
  EXPECT_EQ(engines_.decode->sequences().num_free_slots(), free_slots);
  EXPECT_EQ(receiver_->pending(), 0);
}

// A channel receiver makes the reserved slots' sink before it expects the
// ticket: when the sink cannot be made, its error comes back and nothing is
// expected.
TEST_F(ChannelInPlaceEngineTest, ASinkThatCannotBeMadeLeavesTheTicketUnexpected) {
  engine::SequenceTable& table = engines_.decode->sequences();
  auto reservation = table.ReserveImport(kTokens);
  ASSERT_TRUE(reservation.ok());
  auto ticket = TicketFor(table, *reservation, 8, "decode-0", absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(ticket.ok());
  int calls = 0;
  const absl::Status expected =
      receiver_->ExpectReservation(&*ticket, [&]() -> absl::StatusOr<std::unique_ptr<PageSink>> {
        ++calls;
        return absl::FailedPreconditionError("slot 3 is not importing");
      });
  EXPECT_EQ(expected.code(), absl::StatusCode::kFailedPrecondition) << expected;
  EXPECT_THAT(expected.message(), HasSubstr("slot 3 is not importing"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(receiver_->pending(), 0);
  ASSERT_TRUE(table.AbortImport(reservation->id).ok());
}

TEST_F(ChannelInPlaceEngineTest, ARegionSplitMismatchIsRefusedBeforeAnyPageMoves) {
  // A sink that splits each slot in halves where the engine sends 2 * layers regions.
  std::vector<std::string> slots = EmptySlots(kTokens / 16, engines_.decode->sequences().layout().page_bytes());
  const int64_t half = engines_.decode->sequences().layout().page_bytes() / 2;
  engine::SequenceTable& table = engines_.decode->sequences();
  auto reservation = table.ReserveImport(kTokens);
  ASSERT_TRUE(reservation.ok());
  auto ticket = TicketFor(table, *reservation, 7, "decode-0", absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(
      receiver_->ExpectFrom(kPeer, &*ticket, std::make_unique<HostSink>(&slots, std::vector<int64_t>{half, half}))
          .ok());
  FakeFault f;
  f.kind = FakeFault::Kind::kBreak;
  f.from_rank = 1;
  f.message = 2;  // the first region
  ASSERT_TRUE(factory_.InjectFault(ticket->channel_id, f).ok());
  auto source = SequenceStateSource::Create(engines_.prefill->sequences(), src_, *ticket,
                                            engines_.weights->fingerprint(), common::Hash128{}, 17, -1.5f);
  ASSERT_TRUE(source.ok());
  absl::Status sent;
  std::thread sending([&] { sent = sender_.Send(*ticket, *source); });
  auto received = receiver_->Await(7);
  sending.join();
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(received.status().message(), HasSubstr("regions"));
  EXPECT_EQ(receiver_->channels(), 1);
  EXPECT_EQ(slots, EmptySlots(kTokens / 16, engines_.decode->sequences().layout().page_bytes()));
  ASSERT_TRUE(table.AbortImport(reservation->id).ok());
}

}  // namespace
}  // namespace hybridserve::transport
