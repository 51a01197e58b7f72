// The channel data plane (channel_protocol.h) over the in-memory fake
// communicator, pages staged: a sender and a receiver on two threads, its
// channels, and faults injected at exact message indices
// (channel_test_fixture.h); then the engine end to end over it, as
// transport_test.cc does for TCP. Pages in place: channel_in_place_test.cc.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/hash.h"
#include "common/wait_for.h"
#include "engine/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/channel_receiver.h"
#include "transport/channel_sender.h"
#include "transport/channel_test_fixture.h"
#include "transport/engine_import.h"
#include "transport/engine_pair_test_util.h"
#include "transport/fake_communicator.h"
#include "transport/in_process_transport.h"
#include "transport/routing_sender.h"

namespace hybridserve::transport {
namespace {

using ::testing::HasSubstr;

TEST_F(ChannelTransportTest, ATransferArrivesBitIdenticalToTheSource) {
  const RandomSource source(1);
  const Ticket t = Expect(1);
  EXPECT_EQ(t.channel_id, factory_.last_unique_id());
  auto [sent, received] = Transfer(t, source);
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->transfer_id, 1u);
  ExpectIdentical(*received, source);
  EXPECT_EQ(receiver_->pending(), 0);
  EXPECT_EQ(receiver_->refused(), 0);
}

// A decode worker paired with one prefill worker: ExpectTicket completes the
// ticket (kind, the channel to the default peer), and a prefill worker that
// serves several planes routes each ticket by its kind.
TEST_F(ChannelTransportTest, ExpectTicketUsesTheDefaultPeerAndARoutingSenderServesEachPlane) {
  ChannelReceiverOptions o;
  o.default_peer = kPeer;
  auto paired = ChannelStateReceiver::Create(factory_, o);
  ASSERT_TRUE(paired.ok()) << paired.status();
  Ticket t = RandomSourceTicket(5);
  t.kind = TransportKind::kTcp;
  ASSERT_TRUE((*paired)->ExpectTicket(&t).ok());
  EXPECT_EQ(t.kind, TransportKind::kNccl);
  EXPECT_EQ(t.channel_id, *(*paired)->ChannelFor(kPeer));

  InProcessTransport local;
  Ticket u = t;
  u.transfer_id = 6;
  ASSERT_TRUE(local.ExpectTicket(&u).ok());
  EXPECT_EQ(u.kind, TransportKind::kInProcess);

  RoutingStateSender router;
  router.Route(TransportKind::kNccl, &sender_);
  router.Route(TransportKind::kInProcess, &local);
  const RandomSource source(3);
  absl::Status sent;
  std::thread sender([&] { sent = router.Send(t, source); });
  absl::StatusOr<ReceivedState> received = (*paired)->Await(5);
  sender.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received.status();
  ExpectIdentical(*received, source);
  ASSERT_TRUE(router.Send(u, source).ok());
  auto local_received = local.Await(6);
  ASSERT_TRUE(local_received.ok()) << local_received.status();
  ExpectIdentical(*local_received, source);

  Ticket tcp = t;
  tcp.kind = TransportKind::kTcp;
  const absl::Status refused = router.Send(tcp, source);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("tcp is not served by this worker (in_process, nccl)"));

  auto unpaired = ChannelStateReceiver::Create(factory_, ChannelReceiverOptions());
  ASSERT_TRUE(unpaired.ok());
  Ticket v = t;
  v.transfer_id = 7;
  EXPECT_EQ((*unpaired)->ExpectTicket(&v).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ChannelTransportTest, TransfersFromOnePeerReuseOneChannel) {
  const Ticket a = Expect(1);
  const Ticket b = Expect(2);
  EXPECT_EQ(a.channel_id, b.channel_id);
  const RandomSource sa(1), sb(2);
  auto [sent_a, got_a] = Transfer(a, sa);
  ASSERT_TRUE(sent_a.ok() && got_a.ok()) << sent_a << got_a.status();
  auto [sent_b, got_b] = Transfer(b, sb);
  ASSERT_TRUE(sent_b.ok() && got_b.ok()) << sent_b << got_b.status();
  ExpectIdentical(*got_a, sa);
  ExpectIdentical(*got_b, sb);
  EXPECT_EQ(factory_.links(), 1);
  EXPECT_EQ(receiver_->channels(), 1);
  EXPECT_EQ(sender_.channels(), 1);
  // Another peer gets its own channel.
  auto other = receiver_->ChannelFor("prefill-1:9000");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, a.channel_id);
  EXPECT_EQ(receiver_->channels(), 2);
}

TEST_F(ChannelTransportTest, AnUnknownTransferIdIsRefusedAndCountedAndTheChannelStaysUsable) {
  const Ticket t = Expect(5);
  Ticket stray = t;
  stray.transfer_id = 99;
  const RandomSource source(3);
  const absl::Status s = sender_.Send(stray, source);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;  // its ticket, if any, is not known here
  EXPECT_EQ(receiver_->unauthenticated(), 1);
  EXPECT_EQ(receiver_->refused(), 0);
  auto [sent, received] = Transfer(t, source);
  ASSERT_TRUE(sent.ok() && received.ok()) << sent << received.status();
  ExpectIdentical(*received, source);
  EXPECT_EQ(factory_.links(), 1);
}

// A begin for an expected id without its ticket's secret: refused and
// counted before the transfer is claimed, answered so the channel stays in
// step; the rightful sender then delivers the same transfer on it.
TEST_F(ChannelTransportTest, ABeginWithAnotherSecretIsRefusedAndCountedAndTheRightfulSenderThenDelivers) {
  const Ticket t = Expect(4);
  ASSERT_EQ(t.secret.size(), kTransferSecretBytes);
  const RandomSource source(2);
  for (size_t byte : {size_t{0}, kTransferSecretBytes - 1}) {
    Ticket forged = t;
    forged.secret[byte] ^= 0x80;
    const absl::Status s = sender_.Send(forged, source);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
    EXPECT_THAT(s.message(), HasSubstr("does not present its ticket's secret"));
  }
  EXPECT_EQ(receiver_->unauthenticated(), 2);
  EXPECT_EQ(receiver_->refused(), 0);
  EXPECT_EQ(receiver_->pending(), 1);
  auto [sent, received] = Transfer(t, source);
  ASSERT_TRUE(sent.ok() && received.ok()) << sent << received.status();
  ExpectIdentical(*received, source);
  EXPECT_EQ(factory_.links(), 1);
  EXPECT_EQ(receiver_->channels(), 1);  // in step, still live
  // Another ticket's secret does not open a transfer either: each has its own.
  const Ticket u = Expect(5);
  Ticket swapped = u;
  swapped.secret = t.secret;
  EXPECT_NE(u.secret, t.secret);
  EXPECT_EQ(sender_.Send(swapped, source).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(receiver_->unauthenticated(), 3);
}

// The channel planes send every page: a ticket saying the receiver holds
// some is the sender's error, refused before the channel is touched.
TEST_F(ChannelTransportTest, ATicketWithHeldPagesIsRefusedBeforeTheChannelAndTheTransferStillArrives) {
  const RandomSource source(5);
  const Ticket t = Expect(7);
  Ticket held = t;
  held.held_pages = 1;
  const absl::Status refused = sender_.Send(held, source);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("the channel planes send every page"));
  EXPECT_EQ(receiver_->refused(), 0);
  auto [sent, received] = Transfer(t, source);
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->first_page, 0);
  ExpectIdentical(*received, source);
}

TEST_F(ChannelTransportTest, SizesThatDisagreeWithTheTicketAreRefusedBeforeAnyPageMoves) {
  const Ticket t = Expect(6);
  Ticket bigger = t;
  bigger.page_bytes = 2 * kPageBytes;
  const RandomSource source(4, kPages, 2 * kPageBytes);
  // Were the sender let past the verdict, its first page header would break the channel.
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kBreak, /*from_rank=*/1, /*message=*/2).ok());
  auto [sent, received] = Transfer(bigger, source, t.transfer_id);
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(received.status().message(), HasSubstr("the ticket says"));
  EXPECT_EQ(receiver_->refused(), 1);
  EXPECT_EQ(receiver_->channels(), 1);  // in step, still live
}

TEST_F(ChannelTransportTest, ACorruptedPageIsDataLossOnBothSidesAndTheChannelStaysUsable) {
  const Ticket t = Expect(7);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kCorruptByte, 1, /*message=*/5, /*byte=*/123).ok());  // page 1's payload
  const RandomSource source(5);
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kDataLoss) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(received.status().message(), HasSubstr("checksum"));
  EXPECT_EQ(receiver_->refused(), 1);
  const Ticket next = Expect(8);
  EXPECT_EQ(next.channel_id, t.channel_id);
  auto [sent2, received2] = Transfer(next, source);
  ASSERT_TRUE(sent2.ok() && received2.ok()) << sent2 << received2.status();
  ExpectIdentical(*received2, source);
}

TEST_F(ChannelTransportTest, ACorruptedHeaderFailsTheTransferAndTheNextTicketGetsANewChannel) {
  const Ticket t = Expect(9);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kCorruptByte, 1, /*message=*/4, /*byte=*/20).ok());  // page 1's header
  const RandomSource source(6);
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kDataLoss) << received.status();
  EXPECT_EQ(receiver_->channels(), 0);
  const Ticket next = Expect(10);
  EXPECT_NE(next.channel_id, t.channel_id);
  auto [sent2, received2] = Transfer(next, source);
  ASSERT_TRUE(sent2.ok() && received2.ok()) << sent2 << received2.status();
  ExpectIdentical(*received2, source);
  EXPECT_EQ(sender_.channels(), 1);  // the failed one was dropped
  // A late ticket of the failed channel is refused, not re-joined.
  EXPECT_EQ(sender_.Send(t, source).code(), absl::StatusCode::kUnavailable);
}

TEST_F(ChannelTransportTest, AMessageOfAnotherSizeFailsTheTransferOnBothSides) {
  const Ticket t = Expect(11);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kResize, 1, /*message=*/5, 0, /*size=*/kPageBytes - 1).ok());
  const RandomSource source(7);
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kDataLoss) << received.status();
  EXPECT_EQ(receiver_->pending(), 0);
}

TEST_F(ChannelTransportTest, ASenderDyingMidTransferFailsBothSidesAndEveryTransferOnItsChannel) {
  const Ticket t = Expect(12);
  const Ticket queued = Expect(13);                                        // expected on the same channel, never sent
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kBreak, 1, /*message=*/6).ok());  // dies before page 2
  const RandomSource source(8);
  const absl::Time start = absl::Now();
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kUnavailable) << received.status();
  EXPECT_EQ(receiver_->Await(queued.transfer_id).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // the channel said so: no timeout waited for
  EXPECT_EQ(receiver_->pending(), 0);
  EXPECT_EQ(receiver_->channels(), 0);
}

TEST_F(ChannelTransportTest, AReceiverDyingBeforeItsVerdictFailsBothSides) {
  const Ticket t = Expect(14);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kBreak, 0, /*message=*/1).ok());
  const RandomSource source(9);
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kUnavailable) << received.status();
}

TEST_F(ChannelTransportTest, AStalledSenderFailsBothSidesAfterTheReceiversIoTimeout) {
  MakeReceiver(absl::Milliseconds(300));
  const Ticket t = Expect(15);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kStall, 1, /*message=*/4).ok());  // nothing after page 0 arrives
  const RandomSource source(10);
  const absl::Time start = absl::Now();
  auto [sent, received] = Transfer(t, source);  // the sender's own io_timeout is 10 s
  EXPECT_EQ(received.status().code(), absl::StatusCode::kUnavailable) << received.status();
  EXPECT_THAT(received.status().message(), HasSubstr("stalled"));
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // far below the ticket's 30 s and the sender's 10 s
}

TEST_F(ChannelTransportTest, ATicketPastItsDeadlineIsDeadlineExceeded) {
  const Ticket t = Expect(16, absl::Milliseconds(50));
  EXPECT_EQ(receiver_->Await(t.transfer_id).status().code(), absl::StatusCode::kDeadlineExceeded);
  const RandomSource source(11);
  EXPECT_EQ(sender_.Send(t, source).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(receiver_->pending(), 0);
}

TEST_F(ChannelTransportTest, CancelMakesAwaitReturnCancelledAndTheLateBytesAreRefused) {
  const Ticket t = Expect(17);
  RandomSource source(12);
  source.on_read = [&](int64_t page) {
    // After the receiver has begun the transfer and the awaiter is waiting
    // (not before: an Await that starts after the Cancel finds nothing).
    if (page == 1) {
      EXPECT_TRUE(common::WaitFor([&] { return receiver_->awaiting() == 1; }));
      receiver_->Cancel(t.transfer_id);
    }
    return absl::OkStatus();
  };
  absl::Status sent;
  std::thread sender([&] { sent = sender_.Send(t, source); });
  const absl::StatusOr<ReceivedState> received = receiver_->Await(t.transfer_id);
  sender.join();
  EXPECT_EQ(received.status().code(), absl::StatusCode::kCancelled) << received.status();
  EXPECT_EQ(sent.code(), absl::StatusCode::kNotFound) << sent;
  EXPECT_EQ(receiver_->refused(), 1);
  EXPECT_EQ(receiver_->pending(), 0);
  EXPECT_EQ(receiver_->channels(), 1);  // in step, still live
}

TEST_F(ChannelTransportTest, ASenderThatCannotReadAPageFailsTheTransferAndKeepsTheChannel) {
  const Ticket t = Expect(18);
  RandomSource source(13);
  source.on_read = [](int64_t page) { return page == 2 ? absl::InternalError("page 2 vanished") : absl::OkStatus(); };
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kInternal) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(received.status().message(), HasSubstr("page 2 vanished"));
  const RandomSource good(14);
  const Ticket next = Expect(19);
  auto [sent2, received2] = Transfer(next, good);
  ASSERT_TRUE(sent2.ok() && received2.ok()) << sent2 << received2.status();
  ExpectIdentical(*received2, good);
  EXPECT_EQ(factory_.links(), 1);
}

TEST_F(ChannelTransportTest, TicketsWithoutALiveChannelAreInvalid) {
  Ticket t;
  t.transfer_id = 20;
  t.n_tokens = 1;
  t.max_state_bytes = 1000;
  t.channel_id = "no-such-channel";
  EXPECT_EQ(receiver_->Expect(t).code(), absl::StatusCode::kInvalidArgument);
  t.channel_id.clear();
  t.endpoint = "decode-0";
  RandomSource source(15, 0, 0);
  EXPECT_EQ(sender_.Send(t, source).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChannelStateReceiver::Create(factory_, ChannelReceiverOptions{absl::ZeroDuration()}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- The engine end to end over the fake channel ----

TEST(ChannelEngineTest, TransferredStateContinuesBitIdentically) {
  absl::StatusOr<EnginePair> engines = MakeEnginePair();
  ASSERT_TRUE(engines.ok()) << engines.status();
  const std::unique_ptr<engine::Model>& prefill = engines->prefill;
  const std::unique_ptr<engine::Model>& decode = engines->decode;
  const std::unique_ptr<engine::ModelWeights>& weights = engines->weights;
  const int64_t vocab = weights->config().vocab_size;
  FakeCommunicatorFactory factory;
  ChannelStateSender sender(factory);
  auto receiver = ChannelStateReceiver::Create(factory, ChannelReceiverOptions{});
  ASSERT_TRUE(receiver.ok());

  const int64_t n = 150;
  std::vector<engine::TokenId> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<engine::TokenId>((i * 31 + 5) % vocab);
  auto src = prefill->sequences().New();
  ASSERT_TRUE(prefill->Prefill(*src, tokens).ok());
  auto reservation = decode->sequences().ReserveImport(n);
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  auto ticket = TicketFor(decode->sequences(), *reservation, 1, "decode-0", absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_TRUE((*receiver)->ExpectFrom(kPeer, &*ticket).ok());
  auto source = SequenceStateSource::Create(prefill->sequences(), *src, *ticket, weights->fingerprint(),
                                            common::Hash128{}, /*first_token=*/17, /*first_logprob=*/-1.5f);
  ASSERT_TRUE(source.ok()) << source.status();
  absl::Status sent;
  std::thread sending([&] { sent = sender.Send(*ticket, *source); });
  auto received = (*receiver)->Await(ticket->transfer_id);
  sending.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->first_token, 17);
  EXPECT_EQ(static_cast<int64_t>(received->pages.size()), n / 16);
  ASSERT_TRUE(ImportReceived(decode->sequences(), *reservation, *received).ok());
  for (int step = 0; step < 4; ++step) {
    auto a = decode->DecodeStep({reservation->id}, {static_cast<engine::TokenId>(step + 2)});
    auto b = prefill->DecodeStep({*src}, {static_cast<engine::TokenId>(step + 2)});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << "step " << step;
  }
}

}  // namespace
}  // namespace hybridserve::transport
