// The data plane end to end between two engines: a prefill-side model sends
// a sequence's pages, state and first token; the decode-side model imports
// them into its reservation and continues bit-identically. Run over the
// in-process transport and over real TCP on loopback; then the TCP
// receiver's refusals and failures, each leaving the reservation free.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/hash.h"
#include "common/socket_io.h"
#include "common/wait_for.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/engine_import.h"
#include "transport/engine_pair_test_util.h"
#include "transport/frame.h"
#include "transport/in_process_transport.h"
#include "transport/tcp_transport.h"
#include "transport/transfer_secret.h"

namespace hybridserve::transport {
namespace {

using ::testing::HasSubstr;

std::vector<engine::TokenId> Tokens(int64_t n, int64_t vocab, int64_t seed) {
  std::vector<engine::TokenId> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<engine::TokenId>((i * 31 + seed * 7) % vocab);
  return t;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Which data plane a test runs over.
enum class Plane { kInProcess, kTcp };

class TransportTest : public ::testing::TestWithParam<Plane> {
 protected:
  void SetUp() override {
    absl::StatusOr<EnginePair> engines = MakeEnginePair();
    ASSERT_TRUE(engines.ok()) << engines.status();
    engines_ = *std::move(engines);
    vocab_ = engines_.weights->config().vocab_size;
    if (GetParam() == Plane::kInProcess) {
      auto t = std::make_unique<InProcessTransport>();
      sender_ = t.get();
      receiver_ = t.get();
      in_process_ = std::move(t);
    } else {
      TcpReceiverOptions ro;
      ro.idle_timeout = absl::Milliseconds(500);
      auto r = TcpStateReceiver::Create(ro);
      ASSERT_TRUE(r.ok()) << r.status();
      tcp_receiver_ = *std::move(r);
      endpoint_ = tcp_receiver_->endpoint();
      tcp_sender_ = std::make_unique<TcpStateSender>();
      sender_ = tcp_sender_.get();
      receiver_ = tcp_receiver_.get();
    }
  }

  // Decode reserves `n` tokens and expects transfer `id` (ExpectReservation,
  // as a decode worker does: staged on these planes).
  std::pair<engine::ImportReservation, Ticket> Reserve(int64_t n, uint64_t id,
                                                       absl::Duration timeout = absl::Seconds(30)) {
    auto r = engines_.decode->sequences().ReserveImport(n);
    EXPECT_TRUE(r.ok()) << r.status();
    auto t = TicketFor(engines_.decode->sequences(), *r, id, endpoint_, absl::Now() + timeout);
    EXPECT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(ExpectReservation(*receiver_, &*t, engines_.decode->sequences(), *r).ok());
    return {*r, *t};
  }

  // Prefill's sequence `src` sent on `ticket` (first token 17, logprob
  // -1.5), as the receiver hands it back.
  absl::StatusOr<ReceivedState> SendState(engine::SequenceId src, const Ticket& ticket) {
    absl::StatusOr<SequenceStateSource> source =
        SequenceStateSource::Create(engines_.prefill->sequences(), src, ticket, engines_.weights->fingerprint(),
                                    common::Hash128{}, /*first_token=*/17, /*first_logprob=*/-1.5f);
    if (!source.ok()) return source.status();
    if (absl::Status sent = sender_->Send(ticket, *source); !sent.ok()) return sent;
    return receiver_->Await(ticket.transfer_id);
  }

  std::vector<float> Continue(engine::Model& m, engine::SequenceId id, int steps) {
    std::vector<float> all;
    for (int s = 0; s < steps; ++s) {
      auto l = m.DecodeStep({id}, {static_cast<engine::TokenId>(s + 2)});
      EXPECT_TRUE(l.ok()) << l.status();
      if (!l.ok()) return {};
      all.insert(all.end(), l->begin(), l->end());
    }
    return all;
  }

  EnginePair engines_;
  int64_t vocab_ = 0;
  std::unique_ptr<InProcessTransport> in_process_;
  std::unique_ptr<TcpStateReceiver> tcp_receiver_;
  std::unique_ptr<TcpStateSender> tcp_sender_;
  std::string endpoint_;
  StateSender* sender_ = nullptr;
  StateReceiver* receiver_ = nullptr;
};

TEST_P(TransportTest, TransferredStateContinuesBitIdentically) {
  for (int64_t n : {int64_t{5}, int64_t{16}, int64_t{150}}) {
    SCOPED_TRACE(n);
    const int64_t free_pages = engines_.decode->sequences().num_free_pages();
    auto src = engines_.prefill->sequences().New();
    ASSERT_TRUE(engines_.prefill->Prefill(*src, Tokens(n, vocab_, n)).ok());
    auto [reservation, ticket] = Reserve(n, static_cast<uint64_t>(100 + n));
    absl::StatusOr<ReceivedState> received = SendState(*src, ticket);
    ASSERT_TRUE(received.ok()) << received.status();
    EXPECT_EQ(received->first_token, 17);
    EXPECT_EQ(received->first_logprob, -1.5f);
    EXPECT_EQ(static_cast<int64_t>(received->pages.size()), n / 16);
    ASSERT_TRUE(ImportReceived(engines_.decode->sequences(), reservation, *received).ok());
    EXPECT_TRUE(BitEqual(Continue(*engines_.decode, reservation.id, 4), Continue(*engines_.prefill, *src, 4)));
    EXPECT_EQ(receiver_->pending(), 0);
    ASSERT_TRUE(engines_.decode->sequences().Release(reservation.id).ok());
    ASSERT_TRUE(engines_.prefill->sequences().Release(*src).ok());
    EXPECT_EQ(engines_.decode->sequences().num_free_pages(), free_pages);
  }
}

// The staged planes take no pages in place, so they never resolve the
// reservation's slots (a backend synchronization per page): the ticket is
// expected without calling the sink factory.
TEST_P(TransportTest, AStagedPlaneExpectsAReservationWithoutMakingItsSink) {
  engine::SequenceTable& table = engines_.decode->sequences();
  auto reservation = table.ReserveImport(40);
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  auto ticket = TicketFor(table, *reservation, 9, endpoint_, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  int calls = 0;
  const absl::Status expected =
      receiver_->ExpectReservation(&*ticket, [&]() -> absl::StatusOr<std::unique_ptr<PageSink>> {
        ++calls;
        return absl::InternalError("a staged plane asked for the reserved slots");
      });
  EXPECT_TRUE(expected.ok()) << expected;
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(receiver_->pending(), 1);
  EXPECT_EQ(ticket->secret.size(), kTransferSecretBytes);
  receiver_->Cancel(9);
  EXPECT_EQ(receiver_->pending(), 0);
  ASSERT_TRUE(table.AbortImport(reservation->id).ok());
}

// The receiver writes the first pages itself (as decode does from the
// cache) and the sender sends from a page at most that far: the receiver's
// pages before it are kept, the sender's replace the others, and the
// sequence continues bit identically; a sender that skipped a page the
// receiver does not hold is refused.
TEST_P(TransportTest, HeldPagesAreNotSentAndTheImportContinuesBitIdentically) {
  const int64_t n = 150;  // 9 full pages
  auto src = engines_.prefill->sequences().New();
  ASSERT_TRUE(engines_.prefill->Prefill(*src, Tokens(n, vocab_, n)).ok());
  struct Case {
    int64_t held;       // pages the receiver wrote itself
    int64_t sent_from;  // the sender's ticket's held_pages
  };
  for (const Case c : {Case{0, 0}, Case{1, 1}, Case{5, 5}, Case{9, 9}, Case{5, 2}, Case{4, 5}}) {
    SCOPED_TRACE(absl::StrCat(c.held, " pages held, sent from ", c.sent_from));
    const int64_t free_pages = engines_.decode->sequences().num_free_pages();
    auto [reservation, ticket] = Reserve(n, static_cast<uint64_t>(300 + 10 * c.held + c.sent_from));
    auto views = engines_.decode->sequences().ImportPageHostViews(reservation.id, c.held);
    ASSERT_TRUE(views.ok()) << views.status();
    for (int64_t i = 0; i < c.held; ++i) {
      const std::string page = *engines_.prefill->sequences().ExportPage(*src, i);
      size_t at = 0;
      for (absl::Span<char> segment : (*views)[static_cast<size_t>(i)]) {
        std::memcpy(segment.data(), page.data() + at, segment.size());
        at += segment.size();
      }
    }
    ticket.held_pages = c.sent_from;
    absl::StatusOr<ReceivedState> received = SendState(*src, ticket);
    ASSERT_TRUE(received.ok()) << received.status();
    EXPECT_EQ(received->first_page, c.sent_from);
    EXPECT_EQ(static_cast<int64_t>(received->pages.size()), 9 - c.sent_from);
    const absl::Status imported = ImportReceived(engines_.decode->sequences(), reservation, *received, c.held);
    if (c.sent_from > c.held) {
      EXPECT_EQ(imported.code(), absl::StatusCode::kInvalidArgument) << imported;
      EXPECT_THAT(imported.message(), HasSubstr("sent from page 5; the receiver holds 4"));
      EXPECT_EQ(engines_.decode->sequences().num_free_pages(), free_pages);  // the reservation is freed
      continue;
    }
    ASSERT_TRUE(imported.ok()) << imported;
    auto twin = engines_.prefill->sequences().Fork(*src);
    ASSERT_TRUE(twin.ok()) << twin.status();
    EXPECT_TRUE(BitEqual(Continue(*engines_.decode, reservation.id, 4), Continue(*engines_.prefill, *twin, 4)));
    ASSERT_TRUE(engines_.decode->sequences().Release(reservation.id).ok());
    ASSERT_TRUE(engines_.prefill->sequences().Release(*twin).ok());
    EXPECT_EQ(engines_.decode->sequences().num_free_pages(), free_pages);
  }
}

TEST_P(TransportTest, ATicketHoldingMorePagesThanItHasIsRefusedBySenderAndImport) {
  auto src = engines_.prefill->sequences().New();
  ASSERT_TRUE(engines_.prefill->Prefill(*src, Tokens(40, vocab_, 3)).ok());  // 2 full pages
  auto [reservation, ticket] = Reserve(40, 400);
  auto source = SequenceStateSource::Create(engines_.prefill->sequences(), *src, ticket,
                                            engines_.weights->fingerprint(), common::Hash128{}, 1, 0.0f);
  ASSERT_TRUE(source.ok()) << source.status();
  for (const int64_t held : {int64_t{3}, int64_t{-1}}) {
    Ticket bad = ticket;
    bad.held_pages = held;
    EXPECT_EQ(sender_->Send(bad, *source).code(), absl::StatusCode::kInvalidArgument) << held;
    EXPECT_EQ(CheckTicket(engines_.prefill->sequences(), bad).code(), absl::StatusCode::kInvalidArgument);
  }
  // The receiver itself never claims more pages than the import has.
  ASSERT_TRUE(sender_->Send(ticket, *source).ok());
  auto received = receiver_->Await(ticket.transfer_id);
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(ImportReceived(engines_.decode->sequences(), reservation, *received, 3).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportTest, UnknownCancelledAndLateTransfersAreRefused) {
  auto src = engines_.prefill->sequences().New();
  ASSERT_TRUE(engines_.prefill->Prefill(*src, Tokens(40, vocab_, 1)).ok());
  auto [reservation, ticket] = Reserve(40, 7);
  auto source = SequenceStateSource::Create(engines_.prefill->sequences(), *src, ticket,
                                            engines_.weights->fingerprint(), common::Hash128{}, 1, 0.0f);
  ASSERT_TRUE(source.ok());
  // A transfer the receiver does not expect (never, or no longer) cannot be
  // told from a stranger's: refused as unauthenticated; TCP closes the
  // connection without a verdict.
  const absl::StatusCode unexpected =
      GetParam() == Plane::kTcp ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnauthenticated;
  Ticket stray = ticket;
  stray.transfer_id = 999;
  EXPECT_EQ(sender_->Send(stray, *source).code(), unexpected);
  receiver_->Cancel(ticket.transfer_id);
  const absl::Status late = sender_->Send(ticket, *source);
  EXPECT_EQ(late.code(), unexpected);
  if (GetParam() == Plane::kTcp) EXPECT_THAT(late.message(), HasSubstr("closed the connection without a verdict"));
  EXPECT_EQ(receiver_->Await(ticket.transfer_id).status().code(), absl::StatusCode::kNotFound);
  // (TCP counts before it closes: the count is in before Send returns.)
  EXPECT_EQ(receiver_->unauthenticated(), 2);
  EXPECT_EQ(receiver_->refused(), 0);
  // A deadline that passes with nothing sent: DEADLINE_EXCEEDED, then forgotten.
  ASSERT_TRUE(engines_.decode->sequences().AbortImport(reservation.id).ok());
  auto [r2, t2] = Reserve(40, 8, absl::Milliseconds(50));
  EXPECT_EQ(receiver_->Await(t2.transfer_id).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(sender_->Send(t2, *source).code(),
            GetParam() == Plane::kTcp ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnauthenticated);
  ASSERT_TRUE(engines_.decode->sequences().AbortImport(r2.id).ok());
  EXPECT_EQ(engines_.decode->sequences().num_free_pages(), 64);
}

TEST_P(TransportTest, ASenderWithoutTheTicketsSecretIsRefusedAndTheRightfulSenderThenDelivers) {
  auto src = engines_.prefill->sequences().New();
  ASSERT_TRUE(engines_.prefill->Prefill(*src, Tokens(40, vocab_, 4)).ok());
  auto [reservation, ticket] = Reserve(40, 11);
  ASSERT_EQ(ticket.secret.size(), kTransferSecretBytes);
  auto source = SequenceStateSource::Create(engines_.prefill->sequences(), *src, ticket,
                                            engines_.weights->fingerprint(), common::Hash128{}, 3, -0.5f);
  ASSERT_TRUE(source.ok()) << source.status();
  // Guesses that differ from the secret in one bit of its first or last byte.
  for (size_t byte : {size_t{0}, kTransferSecretBytes - 1}) {
    Ticket forged = ticket;
    forged.secret[byte] ^= 1;
    const absl::Status s = sender_->Send(forged, *source);
    EXPECT_EQ(s.code(), GetParam() == Plane::kTcp ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnauthenticated)
        << s;
  }
  EXPECT_EQ(receiver_->unauthenticated(), 2);
  EXPECT_EQ(receiver_->refused(), 0);
  EXPECT_EQ(receiver_->pending(), 1);  // untouched
  ASSERT_TRUE(sender_->Send(ticket, *source).ok());
  auto received = receiver_->Await(ticket.transfer_id);
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->first_token, 3);
  ASSERT_TRUE(ImportReceived(engines_.decode->sequences(), reservation, *received).ok());
  EXPECT_TRUE(BitEqual(Continue(*engines_.decode, reservation.id, 2), Continue(*engines_.prefill, *src, 2)));
}

TEST_P(TransportTest, ATicketOfAnotherLayoutIsRefusedBeforeAnyByteMoves) {
  auto src = engines_.prefill->sequences().New();
  ASSERT_TRUE(engines_.prefill->Prefill(*src, Tokens(40, vocab_, 2)).ok());
  auto [reservation, ticket] = Reserve(40, 9);
  Ticket other = ticket;
  other.page_format.lo ^= 1;
  auto source = SequenceStateSource::Create(engines_.prefill->sequences(), *src, other, engines_.weights->fingerprint(),
                                            common::Hash128{}, 1, 0.0f);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(source.status().message(), HasSubstr("another model layout or page size"));
  EXPECT_EQ(receiver_->pending(), 1);  // still waiting for a good sender
}

TEST_P(TransportTest, ACorruptStateIsNeverImportedAndFreesTheReservation) {
  auto src = engines_.prefill->sequences().New();
  ASSERT_TRUE(engines_.prefill->Prefill(*src, Tokens(40, vocab_, 3)).ok());
  const int64_t free_pages = engines_.decode->sequences().num_free_pages();
  auto [reservation, ticket] = Reserve(40, 10);
  auto source = SequenceStateSource::Create(engines_.prefill->sequences(), *src, ticket,
                                            engines_.weights->fingerprint(), common::Hash128{}, 1, 0.0f);
  ASSERT_TRUE(sender_->Send(ticket, *source).ok());
  auto received = receiver_->Await(ticket.transfer_id);
  ASSERT_TRUE(received.ok());
  received->state[200] ^= 1;
  EXPECT_EQ(ImportReceived(engines_.decode->sequences(), reservation, *received).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(engines_.decode->sequences().num_free_pages(), free_pages);
  EXPECT_EQ(engines_.decode->sequences().Find(reservation.id).status().code(), absl::StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Planes, TransportTest, ::testing::Values(Plane::kInProcess, Plane::kTcp),
                         [](const ::testing::TestParamInfo<Plane>& p) {
                           return p.param == Plane::kTcp ? std::string("Tcp") : std::string("InProcess");
                         });

// ---- TCP: what a hostile or broken sender gets ----

class TcpReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TcpReceiverOptions o;
    o.idle_timeout = absl::Milliseconds(300);
    auto r = TcpStateReceiver::Create(o);
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = *std::move(r);
    ticket_.transfer_id = 5;
    ticket_.endpoint = receiver_->endpoint();
    ticket_.n_tokens = 40;
    ticket_.page_format = common::Hash128{1, 2};
    ticket_.num_pages = 2;
    ticket_.page_bytes = 64;
    ticket_.max_state_bytes = 100;
    ticket_.deadline = absl::Now() + absl::Seconds(30);
    ASSERT_TRUE(receiver_->ExpectTicket(&ticket_).ok());  // kind TCP, a new secret
  }

  common::Socket Dial() {
    auto s = common::Connect(receiver_->endpoint(), absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }

  static void Write(common::Socket& s, FrameType type, uint64_t id, uint64_t index, const std::string& payload) {
    ASSERT_TRUE(s.WriteFull(EncodeFrameHeader(type, id, index, payload), absl::Now() + absl::Seconds(5)).ok());
    ASSERT_TRUE(s.WriteFull(payload, absl::Now() + absl::Seconds(5)).ok());
  }

  // The begin of the rightful sender: with the ticket's secret.
  BeginPayload Begin() const {
    BeginPayload b;
    b.n_tokens = 40;
    b.page_format = ticket_.page_format;
    b.num_pages = 2;
    b.page_bytes = 64;
    b.state_bytes = 80;
    b.secret = ticket_.secret;
    return b;
  }

  // The receiver's verdict on this connection.
  static absl::Status Ack(common::Socket& s) {
    char raw[kFrameHeaderBytes];
    absl::Status read = s.ReadFull(raw, sizeof(raw), absl::Now() + absl::Seconds(5));
    if (!read.ok()) return read;
    auto h = DecodeFrameHeader(absl::string_view(raw, sizeof(raw)));
    if (!h.ok()) return h.status();
    std::string payload(h->payload_bytes, '\0');
    read = s.ReadFull(payload.data(), payload.size(), absl::Now() + absl::Seconds(5));
    if (!read.ok()) return read;
    absl::Status carried;
    absl::Status decoded = DecodeAck(payload, &carried);
    return decoded.ok() ? carried : decoded;
  }

  std::unique_ptr<TcpStateReceiver> receiver_;
  Ticket ticket_;
};

TEST_F(TcpReceiverTest, ACorruptedPageIsDataLossOnBothSides) {
  common::Socket s = Dial();
  Write(s, FrameType::kBegin, 5, 0, EncodeBegin(Begin()));
  std::string page(64, 'p');
  std::string header = EncodeFrameHeader(FrameType::kPage, 5, 0, page);
  page[10] ^= 1;  // flipped after the checksum was taken
  ASSERT_TRUE(s.WriteFull(header + page, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(Ack(s).code(), absl::StatusCode::kDataLoss);
  auto r = receiver_->Await(5);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("checksum"));
}

TEST_F(TcpReceiverTest, SizesBeyondTheTicketAreRefusedBeforeAllocation) {
  common::Socket s = Dial();
  BeginPayload b = Begin();
  b.page_bytes = int64_t{1} << 40;  // would be a terabyte per page
  Write(s, FrameType::kBegin, 5, 0, EncodeBegin(b));
  EXPECT_EQ(Ack(s).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(receiver_->Await(5).status().message(), HasSubstr("the ticket says"));
}

TEST_F(TcpReceiverTest, ABeginPastTheLastPageIsRefusedAndOneFromAPageReadsFromThere) {
  {
    common::Socket s = Dial();
    Write(s, FrameType::kBegin, 5, 3, EncodeBegin(Begin()));  // 2 pages: at most 2 held
    EXPECT_EQ(Ack(s).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(receiver_->Await(5).status().message(), HasSubstr("starts at page 3 of its 2"));
  }
  ticket_.transfer_id = 6;
  ASSERT_TRUE(receiver_->ExpectTicket(&ticket_).ok());
  BeginPayload b = Begin();
  b.secret = ticket_.secret;
  common::Socket s = Dial();
  Write(s, FrameType::kBegin, 6, 1, EncodeBegin(b));
  Write(s, FrameType::kPage, 6, 1, std::string(64, 'q'));  // page 1 only
  Write(s, FrameType::kState, 6, 0, std::string(80, 's'));
  Write(s, FrameType::kEnd, 6, 0, EncodeEnd(EndPayload{3, -0.5f}));
  EXPECT_TRUE(Ack(s).ok());
  auto r = receiver_->Await(6);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first_page, 1);
  ASSERT_EQ(r->pages.size(), 1);
  EXPECT_EQ(std::string(r->pages[0]), std::string(64, 'q'));
}

TEST_F(TcpReceiverTest, APageOutOfOrderOrOfAnotherTransferIsRefused) {
  common::Socket s = Dial();
  Write(s, FrameType::kBegin, 5, 0, EncodeBegin(Begin()));
  Write(s, FrameType::kPage, 5, 1, std::string(64, 'p'));  // page 1 before page 0
  EXPECT_EQ(Ack(s).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(receiver_->Await(5).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TcpReceiverTest, APeerThatDiesMidTransferFailsItWithinTheIdleTimeout) {
  {
    common::Socket s = Dial();
    Write(s, FrameType::kBegin, 5, 0, EncodeBegin(Begin()));
    Write(s, FrameType::kPage, 5, 0, std::string(64, 'p'));
  }  // closed: the sender died
  const absl::Time start = absl::Now();
  auto r = receiver_->Await(5);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // far below the ticket's 30 s deadline
  EXPECT_EQ(receiver_->pending(), 0);
}

TEST_F(TcpReceiverTest, APeerThatStallsFailsAfterTheIdleTimeout) {
  common::Socket s = Dial();
  Write(s, FrameType::kBegin, 5, 0, EncodeBegin(Begin()));
  auto r = receiver_->Await(5);  // nothing more is sent; the socket stays open
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status()) || absl::IsUnavailable(r.status())) << r.status();
  EXPECT_EQ(Ack(s).code(), r.status().code());
}

// What the rightful sender of ticket_ sends: 2 pages of 64 bytes, 80 of state.
class TwoPages final : public StateSource {
 public:
  int64_t num_pages() const override { return 2; }
  int64_t page_bytes() const override { return 64; }
  absl::Status ReadPage(int64_t index, absl::Span<char> out) const override {
    std::memset(out.data(), static_cast<int>('a' + index), out.size());
    return absl::OkStatus();
  }
  absl::string_view state() const override { return state_; }
  int32_t first_token() const override { return 9; }
  float first_logprob() const override { return -0.5f; }

 private:
  const std::string state_ = std::string(80, 's');
};

// A stranger: anyone who reaches the port without the ticket. Whatever it
// does, it gets no answer (a verdict would tell it which ids are expected),
// the expected transfer stays untouched, and the rightful sender delivers it
// afterwards.
TEST_F(TcpReceiverTest, StrangersAreDroppedWithoutAWordAndTheRightfulSenderStillDelivers) {
  const absl::StatusCode dropped = absl::StatusCode::kUnavailable;  // the connection closed, no verdict
  // (a) connects, sends nothing and closes.
  { common::Socket s = Dial(); }
  ASSERT_TRUE(common::WaitFor([&] { return receiver_->unauthenticated() == 1; })) << receiver_->unauthenticated();
  // (b) garbage: 48 bytes that are no header; a valid page frame first; a
  // version 1 begin (no secret); a begin whose payload fails its checksum.
  {
    common::Socket s = Dial();
    ASSERT_TRUE(s.WriteFull(std::string(48, 'G'), absl::Now() + absl::Seconds(5)).ok());
    EXPECT_EQ(Ack(s).code(), dropped);
  }
  {
    common::Socket s = Dial();
    Write(s, FrameType::kPage, 5, 0, std::string(64, 'p'));
    EXPECT_EQ(Ack(s).code(), dropped);
  }
  {
    common::Socket s = Dial();
    std::string v1 = EncodeFrameHeader(FrameType::kBegin, 5, 0, std::string(48, '\0'));
    v1[4] = 1;  // version 1, its checksum made good again
    const uint64_t sum = common::Checksum64(v1.data(), 40);
    std::memcpy(v1.data() + 40, &sum, sizeof(sum));
    ASSERT_TRUE(s.WriteFull(v1 + std::string(48, '\0'), absl::Now() + absl::Seconds(5)).ok());
    EXPECT_EQ(Ack(s).code(), dropped);
  }
  {
    common::Socket s = Dial();
    const std::string payload = EncodeBegin(Begin());
    std::string bad = payload;
    bad[0] ^= 1;
    ASSERT_TRUE(
        s.WriteFull(EncodeFrameHeader(FrameType::kBegin, 5, 0, payload) + bad, absl::Now() + absl::Seconds(5)).ok());
    EXPECT_EQ(Ack(s).code(), dropped);
  }
  EXPECT_EQ(receiver_->unauthenticated(), 5);  // each counted before its connection closed
  // (c) a well-formed begin for the expected id with a wrong secret (one bit
  // off), and with the right secret for an id not expected.
  {
    common::Socket s = Dial();
    BeginPayload b = Begin();
    b.secret[7] ^= 0x40;
    Write(s, FrameType::kBegin, 5, 0, EncodeBegin(b));
    EXPECT_EQ(Ack(s).code(), dropped);
  }
  {
    common::Socket s = Dial();
    Write(s, FrameType::kBegin, 6, 0, EncodeBegin(Begin()));
    EXPECT_EQ(Ack(s).code(), dropped);
  }
  EXPECT_EQ(receiver_->unauthenticated(), 7);
  EXPECT_EQ(receiver_->refused(), 0);
  EXPECT_EQ(receiver_->pending(), 1);

  // A stranger that connects and stays silent holds one connection until
  // idle_timeout; meanwhile the rightful sender delivers the same transfer.
  common::Socket silent = Dial();
  TcpStateSender sender;
  const TwoPages source;
  absl::Status sent;
  std::thread sending([&] { sent = sender.Send(ticket_, source); });
  absl::StatusOr<ReceivedState> received = receiver_->Await(5);
  sending.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->pages[0], std::string(64, 'a'));
  EXPECT_EQ(received->pages[1], std::string(64, 'b'));
  EXPECT_EQ(received->state, std::string(80, 's'));
  EXPECT_EQ(received->first_token, 9);
  ASSERT_TRUE(common::WaitFor([&] { return receiver_->unauthenticated() == 8; })) << receiver_->unauthenticated();
  EXPECT_EQ(Ack(silent).code(), dropped);
  EXPECT_EQ(receiver_->refused(), 0);
}

// A sender that presents the ticket's secret has proved it: its refusals
// are answered (and counted in refused()), here a transfer already finished.
TEST_F(TcpReceiverTest, ASenderWithTheSecretOfAFinishedTransferIsAnsweredNotFound) {
  TcpStateSender sender;
  const TwoPages source;
  ASSERT_TRUE(sender.Send(ticket_, source).ok());  // finished, waiting for Await
  common::Socket again = Dial();
  Write(again, FrameType::kBegin, 5, 0, EncodeBegin(Begin()));
  const absl::Status answer = Ack(again);
  EXPECT_EQ(answer.code(), absl::StatusCode::kNotFound) << answer;
  EXPECT_THAT(answer.message(), HasSubstr("has finished"));
  EXPECT_EQ(receiver_->refused(), 1);
  EXPECT_EQ(receiver_->unauthenticated(), 0);
  EXPECT_TRUE(receiver_->Await(5).ok());
}

// The socket buffers are a request the kernel may cap; left to its
// autotuning (0) a transfer delivers the same bytes, and a negative size is
// refused by name.
TEST_F(TcpReceiverTest, BuffersLeftToTheKernelDeliverTooAndANegativeSizeIsRefused) {
  TcpSenderOptions autotuned;
  autotuned.socket_buffer_bytes = 0;
  TcpStateSender sender(autotuned);
  const TwoPages source;
  ASSERT_TRUE(sender.Send(ticket_, source).ok());
  absl::StatusOr<ReceivedState> received = receiver_->Await(5);
  ASSERT_TRUE(received.ok()) << received.status();
  std::string page(static_cast<size_t>(source.page_bytes()), '\0');
  for (int64_t i = 0; i < source.num_pages(); ++i) {
    ASSERT_TRUE(source.ReadPage(i, absl::MakeSpan(page)).ok());
    EXPECT_EQ(received->pages[i], page) << "page " << i;
  }
  TcpReceiverOptions negative;
  negative.socket_buffer_bytes = -1;
  EXPECT_THAT(TcpStateReceiver::Create(negative).status().message(), HasSubstr("socket_buffer_bytes"));
}

TEST_F(TcpReceiverTest, AReceiverThatIsGoneIsUnavailable) {
  const std::string gone = receiver_->endpoint();
  receiver_.reset();
  TcpStateSender sender;
  Ticket t = ticket_;
  t.endpoint = gone;
  const TwoPages source;
  EXPECT_EQ(sender.Send(t, source).code(), absl::StatusCode::kUnavailable);
  t.secret.pop_back();
  EXPECT_EQ(sender.Send(t, source).code(), absl::StatusCode::kInvalidArgument);  // before connecting
  EXPECT_EQ(TcpStateReceiver::Create(TcpReceiverOptions{"no-port-here"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::transport
