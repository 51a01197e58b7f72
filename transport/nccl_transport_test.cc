// The NCCL data plane's protocol over the in-memory fake communicator: a
// sender and a receiver on two threads, faults injected per message of the
// channel. Then the engine end to end over it, as transport_test.cc does for
// TCP.
//
// Message indices on the fake link follow nccl_transport.h: the sender
// (rank 1) sends 0 begin header, 1 begin payload, then staged header 2 + 2i
// and payload 3 + 2i of page i, or in place region r of page i as message
// 2 + i * regions + r; the receiver (rank 0) sends 0 the verdict's header,
// 1 its payload, 2 and 3 the final ack. Pages in place are tested with host
// buffers standing for device memory (the fake copies whatever it is given)
// and, end to end, with the CPU backend's pools.

#include "transport/nccl_transport.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/hash.h"
#include "common/runfiles.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/engine_import.h"
#include "transport/fake_communicator.h"
#include "transport/in_process_transport.h"
#include "transport/routing_sender.h"

namespace hybridserve::transport {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kPages = 4;
constexpr int64_t kPageBytes = 1000;
constexpr int64_t kStateBytes = 777;
constexpr char kPeer[] = "prefill-0:9000";

// Pseudo-random pages and state from a seed. `on_read`, when set, runs before
// each ReadPage and may fail it.
class RandomSource final : public StateSource {
 public:
  explicit RandomSource(uint64_t seed, int64_t num_pages = kPages, int64_t page_bytes = kPageBytes) {
    std::mt19937_64 rng(seed);
    auto fill = [&rng](std::string& s) {
      for (char& c : s) c = static_cast<char>(rng());
    };
    pages_.assign(static_cast<size_t>(num_pages), std::string(static_cast<size_t>(page_bytes), '\0'));
    for (std::string& p : pages_) fill(p);
    state_.assign(kStateBytes, '\0');
    fill(state_);
    page_bytes_ = page_bytes;
  }

  int64_t num_pages() const override { return static_cast<int64_t>(pages_.size()); }
  int64_t page_bytes() const override { return page_bytes_; }
  absl::Status ReadPage(int64_t index, absl::Span<char> out) const override {
    if (on_read) {
      if (absl::Status s = on_read(index); !s.ok()) return s;
    }
    std::memcpy(out.data(), pages_[static_cast<size_t>(index)].data(), out.size());
    return absl::OkStatus();
  }
  // With `split` set, each page as regions of those sizes over its bytes.
  absl::StatusOr<std::vector<MemoryRegion>> PageRegions(int64_t index) const override {
    if (split.empty()) return StateSource::PageRegions(index);
    std::vector<MemoryRegion> regions;
    char* p = const_cast<char*>(pages_[static_cast<size_t>(index)].data());
    for (int64_t bytes : split) {
      regions.push_back(MemoryRegion{p, static_cast<size_t>(bytes)});
      p += bytes;
    }
    return regions;
  }
  absl::string_view state() const override { return state_; }
  int32_t first_token() const override { return 4242; }
  float first_logprob() const override { return -0.625f; }

  const std::vector<std::string>& pages() const { return pages_; }

  std::function<absl::Status(int64_t)> on_read;
  std::vector<int64_t> split;

 private:
  std::vector<std::string> pages_;
  std::string state_;
  int64_t page_bytes_ = 0;
};

// Host buffers standing for reserved slots: page i of `storage`, split into
// regions of `split`. `storage` outlives the sink.
class HostSink final : public PageSink {
 public:
  HostSink(std::vector<std::string>* storage, const std::vector<int64_t>& split) {
    for (std::string& page : *storage) {
      std::vector<MemoryRegion> regions;
      char* p = page.data();
      for (int64_t bytes : split) {
        regions.push_back(MemoryRegion{p, static_cast<size_t>(bytes)});
        p += bytes;
      }
      pages_.push_back(std::move(regions));
    }
  }
  int64_t num_pages() const override { return static_cast<int64_t>(pages_.size()); }
  const std::vector<MemoryRegion>& PageRegions(int64_t index) const override {
    return pages_[static_cast<size_t>(index)];
  }

 private:
  std::vector<std::vector<MemoryRegion>> pages_;
};

std::vector<std::string> EmptySlots(int64_t pages = kPages, int64_t page_bytes = kPageBytes) {
  return std::vector<std::string>(static_cast<size_t>(pages), std::string(static_cast<size_t>(page_bytes), '\0'));
}

class NcclTransportTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeReceiver(absl::Seconds(10)); }

  void MakeReceiver(absl::Duration io_timeout) {
    receiver_.reset();
    NcclReceiverOptions o;
    o.io_timeout = io_timeout;
    o.join_timeout = absl::Seconds(10);
    auto r = NcclStateReceiver::Create(factory_, o);
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = *std::move(r);
  }

  // A ticket for the RandomSource shapes, expected from kPeer (with `sink`
  // for pages in place).
  Ticket Expect(uint64_t id, absl::Duration timeout = absl::Seconds(30), std::unique_ptr<PageSink> sink = nullptr) {
    Ticket t;
    t.transfer_id = id;
    t.endpoint = "decode-0";
    t.n_tokens = kPages * 16 + 3;
    t.page_format = common::Hash128{7, 9};
    t.num_pages = kPages;
    t.page_bytes = kPageBytes;
    t.max_state_bytes = 1000;
    t.deadline = absl::Now() + timeout;
    const absl::Status s = receiver_->ExpectFrom(kPeer, &t, std::move(sink));
    EXPECT_TRUE(s.ok()) << s;
    return t;
  }

  // Sends on another thread and awaits here: {Send's status, Await's result}.
  std::pair<absl::Status, absl::StatusOr<ReceivedState>> Transfer(const Ticket& ticket, const StateSource& source,
                                                                  uint64_t await_id = 0) {
    absl::Status sent;
    std::thread sender([&] { sent = sender_.Send(ticket, source); });
    absl::StatusOr<ReceivedState> received = receiver_->Await(await_id != 0 ? await_id : ticket.transfer_id);
    sender.join();
    return {sent, std::move(received)};
  }

  absl::Status Inject(const Ticket& ticket, FakeFault::Kind kind, int from_rank, int64_t message, size_t byte = 0,
                      size_t size = 0) {
    FakeFault f;
    f.kind = kind;
    f.from_rank = from_rank;
    f.message = message;
    f.byte = byte;
    f.size = size;
    return factory_.InjectFault(ticket.nccl_unique_id, f);
  }

  static void ExpectIdentical(const ReceivedState& got, const RandomSource& source) {
    ASSERT_EQ(got.pages.size(), static_cast<int64_t>(source.pages().size()));
    for (int64_t i = 0; i < got.pages.size(); ++i) EXPECT_EQ(got.pages[i], source.pages()[i]) << "page " << i;
    EXPECT_EQ(got.state, source.state());
    EXPECT_EQ(got.first_token, 4242);
    EXPECT_EQ(got.first_logprob, -0.625f);
  }

  FakeCommunicatorFactory factory_;
  NcclStateSender sender_{factory_};
  std::unique_ptr<NcclStateReceiver> receiver_;
};

TEST_F(NcclTransportTest, ATransferArrivesBitIdenticalToTheSource) {
  const RandomSource source(1);
  const Ticket t = Expect(1);
  EXPECT_EQ(t.nccl_unique_id, factory_.last_unique_id());
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
TEST_F(NcclTransportTest, ExpectTicketUsesTheDefaultPeerAndARoutingSenderServesEachPlane) {
  NcclReceiverOptions o;
  o.default_peer = kPeer;
  auto paired = NcclStateReceiver::Create(factory_, o);
  ASSERT_TRUE(paired.ok()) << paired.status();
  Ticket t;
  t.transfer_id = 5;
  t.endpoint = "decode-0";
  t.n_tokens = kPages * 16 + 3;
  t.page_format = common::Hash128{7, 9};
  t.num_pages = kPages;
  t.page_bytes = kPageBytes;
  t.max_state_bytes = 1000;
  t.deadline = absl::Now() + absl::Seconds(30);
  t.kind = TransportKind::kTcp;
  ASSERT_TRUE((*paired)->ExpectTicket(&t).ok());
  EXPECT_EQ(t.kind, TransportKind::kNccl);
  EXPECT_EQ(t.nccl_unique_id, *(*paired)->ChannelFor(kPeer));

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

  auto unpaired = NcclStateReceiver::Create(factory_, NcclReceiverOptions());
  ASSERT_TRUE(unpaired.ok());
  Ticket v = t;
  v.transfer_id = 7;
  EXPECT_EQ((*unpaired)->ExpectTicket(&v).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(NcclTransportTest, TransfersFromOnePeerReuseOneChannel) {
  const Ticket a = Expect(1);
  const Ticket b = Expect(2);
  EXPECT_EQ(a.nccl_unique_id, b.nccl_unique_id);
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
  EXPECT_NE(*other, a.nccl_unique_id);
  EXPECT_EQ(receiver_->channels(), 2);
}

TEST_F(NcclTransportTest, AnUnknownTransferIdIsRefusedAndCountedAndTheChannelStaysUsable) {
  const Ticket t = Expect(5);
  Ticket stray = t;
  stray.transfer_id = 99;
  const RandomSource source(3);
  const absl::Status s = sender_.Send(stray, source);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(receiver_->refused(), 1);
  auto [sent, received] = Transfer(t, source);
  ASSERT_TRUE(sent.ok() && received.ok()) << sent << received.status();
  ExpectIdentical(*received, source);
  EXPECT_EQ(factory_.links(), 1);
}

TEST_F(NcclTransportTest, SizesThatDisagreeWithTheTicketAreRefusedBeforeAnyPageMoves) {
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

TEST_F(NcclTransportTest, ACorruptedPageIsDataLossOnBothSidesAndTheChannelStaysUsable) {
  const Ticket t = Expect(7);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kCorruptByte, 1, /*message=*/5, /*byte=*/123).ok());  // page 1's payload
  const RandomSource source(5);
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kDataLoss) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(received.status().message(), HasSubstr("checksum"));
  EXPECT_EQ(receiver_->refused(), 1);
  const Ticket next = Expect(8);
  EXPECT_EQ(next.nccl_unique_id, t.nccl_unique_id);
  auto [sent2, received2] = Transfer(next, source);
  ASSERT_TRUE(sent2.ok() && received2.ok()) << sent2 << received2.status();
  ExpectIdentical(*received2, source);
}

TEST_F(NcclTransportTest, ACorruptedHeaderFailsTheTransferAndTheNextTicketGetsANewChannel) {
  const Ticket t = Expect(9);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kCorruptByte, 1, /*message=*/4, /*byte=*/20).ok());  // page 1's header
  const RandomSource source(6);
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kDataLoss) << received.status();
  EXPECT_EQ(receiver_->channels(), 0);
  const Ticket next = Expect(10);
  EXPECT_NE(next.nccl_unique_id, t.nccl_unique_id);
  auto [sent2, received2] = Transfer(next, source);
  ASSERT_TRUE(sent2.ok() && received2.ok()) << sent2 << received2.status();
  ExpectIdentical(*received2, source);
  EXPECT_EQ(sender_.channels(), 1);  // the failed one was dropped
  // A late ticket of the failed channel is refused, not re-joined.
  EXPECT_EQ(sender_.Send(t, source).code(), absl::StatusCode::kUnavailable);
}

TEST_F(NcclTransportTest, AMessageOfAnotherSizeFailsTheTransferOnBothSides) {
  const Ticket t = Expect(11);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kResize, 1, /*message=*/5, 0, /*size=*/kPageBytes - 1).ok());
  const RandomSource source(7);
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kDataLoss) << received.status();
  EXPECT_EQ(receiver_->pending(), 0);
}

TEST_F(NcclTransportTest, ASenderDyingMidTransferFailsBothSidesAndEveryTransferOnItsChannel) {
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

TEST_F(NcclTransportTest, AReceiverDyingBeforeItsVerdictFailsBothSides) {
  const Ticket t = Expect(14);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kBreak, 0, /*message=*/1).ok());
  const RandomSource source(9);
  auto [sent, received] = Transfer(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kUnavailable) << received.status();
}

TEST_F(NcclTransportTest, AStalledSenderFailsBothSidesAfterTheReceiversIoTimeout) {
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

TEST_F(NcclTransportTest, ATicketPastItsDeadlineIsDeadlineExceeded) {
  const Ticket t = Expect(16, absl::Milliseconds(50));
  EXPECT_EQ(receiver_->Await(t.transfer_id).status().code(), absl::StatusCode::kDeadlineExceeded);
  const RandomSource source(11);
  EXPECT_EQ(sender_.Send(t, source).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(receiver_->pending(), 0);
}

TEST_F(NcclTransportTest, CancelMakesAwaitReturnCancelledAndTheLateBytesAreRefused) {
  const Ticket t = Expect(17);
  RandomSource source(12);
  absl::Notification awaiting;
  source.on_read = [&](int64_t page) {
    // After the receiver has begun the transfer and the awaiter is waiting.
    if (page == 1) {
      awaiting.WaitForNotification();
      receiver_->Cancel(t.transfer_id);
    }
    return absl::OkStatus();
  };
  absl::Status sent;
  std::thread sender([&] { sent = sender_.Send(t, source); });
  awaiting.Notify();
  const absl::StatusOr<ReceivedState> received = receiver_->Await(t.transfer_id);
  sender.join();
  EXPECT_EQ(received.status().code(), absl::StatusCode::kCancelled) << received.status();
  EXPECT_EQ(sent.code(), absl::StatusCode::kNotFound) << sent;
  EXPECT_EQ(receiver_->refused(), 1);
  EXPECT_EQ(receiver_->pending(), 0);
  EXPECT_EQ(receiver_->channels(), 1);  // in step, still live
}

TEST_F(NcclTransportTest, ASenderThatCannotReadAPageFailsTheTransferAndKeepsTheChannel) {
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

TEST_F(NcclTransportTest, TicketsWithoutALiveChannelAreInvalid) {
  Ticket t;
  t.transfer_id = 20;
  t.n_tokens = 1;
  t.max_state_bytes = 1000;
  t.nccl_unique_id = "no-such-channel";
  EXPECT_EQ(receiver_->Expect(t).code(), absl::StatusCode::kInvalidArgument);
  t.nccl_unique_id.clear();
  t.endpoint = "decode-0";
  RandomSource source(15, 0, 0);
  EXPECT_EQ(sender_.Send(t, source).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclStateReceiver::Create(factory_, NcclReceiverOptions{absl::ZeroDuration()}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Pages in place ----

TEST_F(NcclTransportTest, PagesOfferedInPlaceLandInTheSinkWithTheSampledPagesChecksums) {
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

TEST_F(NcclTransportTest, TheSamplingRuleChecksEverySixteenthPageAndTheLast) {
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

TEST_F(NcclTransportTest, AnOfferWithoutASinkAndASinkWithoutAnOfferTravelStaged) {
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

TEST_F(NcclTransportTest, ARegionSplitMismatchIsRefusedBeforeAnyPageMoves) {
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

TEST_F(NcclTransportTest, ASourceWhoseRegionsDoNotSplitAPageFailsBeforeAnyMessage) {
  RandomSource source(26);
  source.split = {400, 500};
  const Ticket t = Expect(35);
  ASSERT_TRUE(Inject(t, FakeFault::Kind::kBreak, /*from_rank=*/1, /*message=*/0).ok());
  const absl::Status sent = sender_.Send(t, source);
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument) << sent;
  EXPECT_EQ(receiver_->channels(), 1);  // nothing was sent
  EXPECT_EQ(sender_.channels(), 0);
}

TEST_F(NcclTransportTest, ASenderDyingMidPagesInPlaceFailsBothSidesAndHandsTheSinkBack) {
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

TEST_F(NcclTransportTest, AStallMidPagesInPlaceFailsBothSidesAfterTheIoTimeout) {
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
TEST_F(NcclTransportTest, CancelWaitsForTheRegionInFlightBeforeHandingTheSlotsBack) {
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
  const absl::Status in_flight =
      factory_.AwaitReceiving(t.nccl_unique_id, /*rank=*/0, /*messages=*/3, absl::Seconds(10));
  const bool page_0_landed = in_flight.ok() && slots[0] == source.pages()[0];
  receiver_->Cancel(t.transfer_id);
  const bool still_receiving = factory_.Receiving(t.nccl_unique_id, /*rank=*/0);
  sender.join();
  ASSERT_TRUE(in_flight.ok()) << "the receive of page 1 never began: " << in_flight;
  EXPECT_TRUE(page_0_landed);
  EXPECT_FALSE(still_receiving) << "Cancel returned while a receive into the slots was in flight";
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_EQ(receiver_->pending(), 0);
}

// ---- The engine end to end over the fake channel ----

constexpr char kModelDir[] = "tests/fixtures/golden/nemotron_h_tiny";

using common::Runfile;

TEST(NcclEngineTest, TransferredStateContinuesBitIdentically) {
  auto weights = engine::ModelWeights::LoadDirectory(Runfile(kModelDir));
  ASSERT_TRUE(weights.ok()) << weights.status();
  engine::ModelOptions o;
  o.page_size = 16;
  o.max_pages = 64;
  o.max_sequences = 4;
  auto prefill = engine::Model::Create((*weights)->config(), **weights, o);
  auto decode = engine::Model::Create((*weights)->config(), **weights, o);
  ASSERT_TRUE(prefill.ok() && decode.ok());
  const int64_t vocab = (*weights)->config().vocab_size;
  FakeCommunicatorFactory factory;
  NcclStateSender sender(factory);
  auto receiver = NcclStateReceiver::Create(factory, NcclReceiverOptions{});
  ASSERT_TRUE(receiver.ok());

  const int64_t n = 150;
  std::vector<engine::TokenId> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<engine::TokenId>((i * 31 + 5) % vocab);
  auto src = (*prefill)->sequences().New();
  ASSERT_TRUE((*prefill)->Prefill(*src, tokens).ok());
  auto reservation = (*decode)->sequences().ReserveImport(n);
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  auto ticket = TicketFor((*decode)->sequences(), *reservation, 1, "decode-0", absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_TRUE((*receiver)->ExpectFrom(kPeer, &*ticket).ok());
  auto source = SequenceStateSource::Create((*prefill)->sequences(), *src, *ticket, (*weights)->fingerprint(),
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
  ASSERT_TRUE(ImportReceived((*decode)->sequences(), *reservation, *received).ok());
  for (int step = 0; step < 4; ++step) {
    auto a = (*decode)->DecodeStep({reservation->id}, {static_cast<engine::TokenId>(step + 2)});
    auto b = (*prefill)->DecodeStep({*src}, {static_cast<engine::TokenId>(step + 2)});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << "step " << step;
  }
}

// The same, pages in place: from the prefill engine's pool straight into the
// decode engine's reserved slots (the CPU backend's pools are host memory,
// copied by the fake channel as NCCL copies device memory).
class NcclInPlaceEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = engine::ModelWeights::LoadDirectory(Runfile(kModelDir));
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = *std::move(weights);
    engine::ModelOptions o;
    o.page_size = 16;
    o.max_pages = 64;
    o.max_sequences = 4;
    auto prefill = engine::Model::Create(weights_->config(), *weights_, o);
    auto decode = engine::Model::Create(weights_->config(), *weights_, o);
    ASSERT_TRUE(prefill.ok() && decode.ok());
    prefill_ = *std::move(prefill);
    decode_ = *std::move(decode);
    MakeReceiver(absl::Seconds(10));
    const int64_t vocab = weights_->config().vocab_size;
    std::vector<engine::TokenId> tokens(static_cast<size_t>(kTokens));
    for (int64_t i = 0; i < kTokens; ++i) {
      tokens[static_cast<size_t>(i)] = static_cast<engine::TokenId>((i * 31 + 5) % vocab);
    }
    auto src = prefill_->sequences().New();
    ASSERT_TRUE(src.ok());
    src_ = *src;
    ASSERT_TRUE(prefill_->Prefill(src_, tokens).ok());
  }

  void MakeReceiver(absl::Duration io_timeout) {
    receiver_.reset();
    NcclReceiverOptions o;
    o.io_timeout = io_timeout;
    auto r = NcclStateReceiver::Create(factory_, o);
    ASSERT_TRUE(r.ok());
    receiver_ = *std::move(r);
  }

  // A reservation of kTokens on decode, its ticket expected (in place: with
  // the reservation's sink), `before_send` run on the ticket, then the
  // prefill sequence sent: {Send's status, Await's result}.
  struct Run {
    engine::ImportReservation reservation;
    absl::Status sent;
    absl::StatusOr<ReceivedState> received;
  };
  Run Transfer(uint64_t id, bool in_place, const std::function<void(const Ticket&)>& before_send = nullptr) {
    Run run;
    engine::SequenceTable& table = decode_->sequences();
    auto reservation = table.ReserveImport(kTokens);
    EXPECT_TRUE(reservation.ok()) << reservation.status();
    run.reservation = *reservation;
    auto ticket = TicketFor(table, *reservation, id, "decode-0", absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(ticket.ok());
    std::unique_ptr<PageSink> sink;
    if (in_place) {
      auto made = ReservationPageSink::Create(table, *reservation);
      EXPECT_TRUE(made.ok()) << made.status();
      sink = *std::move(made);
    }
    EXPECT_TRUE(receiver_->ExpectFrom(kPeer, &*ticket, std::move(sink)).ok());
    if (before_send) before_send(*ticket);
    auto source = SequenceStateSource::Create(prefill_->sequences(), src_, *ticket, weights_->fingerprint(),
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
    for (int64_t i = 0; i < kTokens / 16; ++i) out.push_back(*decode_->sequences().ExportPage(id, i));
    std::string state;
    EXPECT_TRUE(
        decode_->sequences().EncodeStateInto(id, true, weights_->fingerprint(), common::Hash128{}, &state).ok());
    out.push_back(state);
    return out;
  }

  static constexpr int64_t kTokens = 150;  // 9 full pages (0 and 8 sampled) and a partial one
  std::unique_ptr<engine::ModelWeights> weights_;
  std::unique_ptr<engine::Model> prefill_;
  std::unique_ptr<engine::Model> decode_;
  engine::SequenceId src_ = 0;
  FakeCommunicatorFactory factory_;
  NcclStateSender sender_{factory_};
  std::unique_ptr<NcclStateReceiver> receiver_;
};

TEST_F(NcclInPlaceEngineTest, ASequenceSentInPlaceContinuesBitIdenticallyToTheSender) {
  Run run = Transfer(1, /*in_place=*/true);
  ASSERT_TRUE(run.sent.ok()) << run.sent;
  ASSERT_TRUE(run.received.ok()) << run.received.status();
  EXPECT_TRUE(run.received->pages_in_place);
  EXPECT_EQ(run.received->pages.size(), 0);
  EXPECT_EQ(run.received->page_checksums.size(), 2u);
  ASSERT_TRUE(ImportReceived(decode_->sequences(), run.reservation, *run.received).ok());
  for (int step = 0; step < 4; ++step) {
    auto a = decode_->DecodeStep({run.reservation.id}, {static_cast<engine::TokenId>(step + 2)});
    auto b = prefill_->DecodeStep({src_}, {static_cast<engine::TokenId>(step + 2)});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << "step " << step;
  }
}

TEST_F(NcclInPlaceEngineTest, StagedAndInPlaceImportTheSameBytes) {
  Run staged = Transfer(1, /*in_place=*/false);
  ASSERT_TRUE(staged.sent.ok() && staged.received.ok()) << staged.sent << staged.received.status();
  EXPECT_FALSE(staged.received->pages_in_place);
  ASSERT_TRUE(ImportReceived(decode_->sequences(), staged.reservation, *staged.received).ok());
  Run in_place = Transfer(2, /*in_place=*/true);
  ASSERT_TRUE(in_place.sent.ok() && in_place.received.ok()) << in_place.sent << in_place.received.status();
  EXPECT_TRUE(in_place.received->pages_in_place);
  ASSERT_TRUE(ImportReceived(decode_->sequences(), in_place.reservation, *in_place.received).ok());
  EXPECT_NE(staged.reservation.page_slots, in_place.reservation.page_slots);
  EXPECT_EQ(ImportedBytes(staged.reservation.id), ImportedBytes(in_place.reservation.id));
  for (int64_t i = 0; i < kTokens / 16; ++i) {
    EXPECT_EQ(*decode_->sequences().ExportPage(in_place.reservation.id, i), *prefill_->sequences().ExportPage(src_, i));
  }
}

TEST_F(NcclInPlaceEngineTest, ASampledPageCorruptedOnTheLinkIsDataLossAndTheReservationIsReleased) {
  const int64_t free_pages = decode_->sequences().num_free_pages();
  const int64_t free_slots = decode_->sequences().num_free_slots();
  const int64_t regions = 2 * decode_->sequences().layout().attention_layers;
  // Page 8, the last (sampled), region 1: message 2 + 8 * regions + 1.
  Run run = Transfer(1, /*in_place=*/true, [&](const Ticket& t) {
    FakeFault f;
    f.kind = FakeFault::Kind::kCorruptByte;
    f.from_rank = 1;
    f.message = 2 + 8 * regions + 1;
    f.byte = 5;
    ASSERT_TRUE(factory_.InjectFault(t.nccl_unique_id, f).ok());
  });
  ASSERT_TRUE(run.sent.ok()) << run.sent;  // the channel cannot see it
  ASSERT_TRUE(run.received.ok()) << run.received.status();
  const absl::Status imported = ImportReceived(decode_->sequences(), run.reservation, *run.received);
  EXPECT_EQ(imported.code(), absl::StatusCode::kDataLoss) << imported;
  EXPECT_THAT(imported.message(), HasSubstr("page 8 landed in place"));
  EXPECT_EQ(decode_->sequences().Find(run.reservation.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(decode_->sequences().num_free_pages(), free_pages);
  EXPECT_EQ(decode_->sequences().num_free_slots(), free_slots);
  // The next transfer imports cleanly.
  Run next = Transfer(2, /*in_place=*/true);
  ASSERT_TRUE(next.sent.ok() && next.received.ok());
  EXPECT_TRUE(ImportReceived(decode_->sequences(), next.reservation, *next.received).ok());
}

TEST_F(NcclInPlaceEngineTest, APeerKilledMidPagesFailsBothSidesWithinTheIoTimeoutAndTheReservationAborts) {
  MakeReceiver(absl::Milliseconds(300));
  const int64_t free_pages = decode_->sequences().num_free_pages();
  const int64_t free_slots = decode_->sequences().num_free_slots();
  const int64_t regions = 2 * decode_->sequences().layout().attention_layers;
  const absl::Time start = absl::Now();
  // The sender dies in the middle of page 4.
  Run run = Transfer(1, /*in_place=*/true, [&](const Ticket& t) {
    FakeFault f;
    f.kind = FakeFault::Kind::kBreak;
    f.from_rank = 1;
    f.message = 2 + 4 * regions + 1;
    ASSERT_TRUE(factory_.InjectFault(t.nccl_unique_id, f).ok());
  });
  EXPECT_EQ(run.sent.code(), absl::StatusCode::kUnavailable) << run.sent;
  EXPECT_EQ(run.received.status().code(), absl::StatusCode::kUnavailable) << run.received.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // What the decode loop does on failure: half-written slots go back unused.
  ASSERT_TRUE(decode_->sequences().AbortImport(run.reservation.id).ok());
  EXPECT_EQ(decode_->sequences().num_free_pages(), free_pages);
  EXPECT_EQ(decode_->sequences().num_free_slots(), free_slots);
  EXPECT_EQ(receiver_->pending(), 0);
}

TEST_F(NcclInPlaceEngineTest, ARegionSplitMismatchIsRefusedBeforeAnyPageMoves) {
  // A sink that splits each slot in halves where the engine sends 2 * layers regions.
  std::vector<std::string> slots = EmptySlots(kTokens / 16, decode_->sequences().layout().page_bytes());
  const int64_t half = decode_->sequences().layout().page_bytes() / 2;
  engine::SequenceTable& table = decode_->sequences();
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
  ASSERT_TRUE(factory_.InjectFault(ticket->nccl_unique_id, f).ok());
  auto source = SequenceStateSource::Create(prefill_->sequences(), src_, *ticket, weights_->fingerprint(),
                                            common::Hash128{}, 17, -1.5f);
  ASSERT_TRUE(source.ok());
  absl::Status sent;
  std::thread sending([&] { sent = sender_.Send(*ticket, *source); });
  auto received = receiver_->Await(7);
  sending.join();
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument) << sent;
  EXPECT_EQ(received.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(received.status().message(), HasSubstr("regions"));
  EXPECT_EQ(receiver_->channels(), 1);
  EXPECT_EQ(slots, EmptySlots(kTokens / 16, decode_->sequences().layout().page_bytes()));
  ASSERT_TRUE(table.AbortImport(reservation->id).ok());
}

}  // namespace
}  // namespace hybridserve::transport
