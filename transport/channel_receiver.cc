#include "transport/channel_receiver.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "transport/channel_protocol.h"

namespace hybridserve::transport {
namespace {

// A channel failure as the transfer that was on it sees it: a stall reads as
// the peer gone.
absl::Status AsTransferFailure(const absl::Status& channel, absl::string_view peer) {
  if (absl::IsDeadlineExceeded(channel)) {
    return absl::UnavailableError(absl::StrCat("peer ", peer, " stalled: ", channel.message()));
  }
  return channel;
}

// kBegin payload sizes: the BeginPayload alone (staged), or followed by an
// in-place offer of 1 to kMaxPageRegions regions.
bool IsBeginPayloadSize(uint64_t bytes) {
  if (bytes == kBeginPayloadBytes) return true;
  if (bytes < kBeginPayloadBytes + RegionOfferBytes(1) ||
      bytes > kBeginPayloadBytes + RegionOfferBytes(kMaxPageRegions)) {
    return false;
  }
  return (bytes - kBeginPayloadBytes) % 8 == 0;
}

}  // namespace

struct ChannelStateReceiver::Channel {
  std::string peer;
  std::string channel_id;
  std::unique_ptr<Communicator> comm;
  absl::Time join_deadline;
  std::thread thread;
  std::atomic<bool> failed{false};    // set once by Fail
  std::atomic<bool> finished{false};  // its thread is done: JoinFinished may join it
};

absl::StatusOr<std::unique_ptr<ChannelStateReceiver>> ChannelStateReceiver::Create(
    CommunicatorFactory& factory, const ChannelReceiverOptions& options) {
  if (options.io_timeout <= absl::ZeroDuration() || options.join_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("channel receiver: io_timeout and join_timeout must be positive");
  }
  return std::unique_ptr<ChannelStateReceiver>(new ChannelStateReceiver(factory, options));
}

ChannelStateReceiver::ChannelStateReceiver(CommunicatorFactory& factory, const ChannelReceiverOptions& options)
    : factory_(factory), options_(options), registry_(options.limits) {}

ChannelStateReceiver::~ChannelStateReceiver() {
  std::vector<std::unique_ptr<Channel>> all;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    all.swap(channels_);
  }
  for (auto& c : all) c->comm->Abort();  // wakes its thread, which fails the channel
  for (auto& c : all) c->thread.join();
}

absl::StatusOr<std::string> ChannelStateReceiver::ChannelFor(absl::string_view peer) {
  JoinFinished();
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("channel receiver is shutting down");
  if (auto it = live_.find(peer); it != live_.end()) return it->second->channel_id;
  ASSIGN_OR_RETURN(std::string channel_id, factory_.NewUniqueId());
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, factory_.Join(channel_id, /*rank=*/0));
  auto channel = std::make_unique<Channel>();
  channel->peer = std::string(peer);
  channel->channel_id = channel_id;
  channel->comm = std::move(comm);
  channel->join_deadline = absl::Now() + options_.join_timeout;
  Channel* c = channel.get();
  live_[c->peer] = c;
  by_id_[c->channel_id] = c;
  channels_.push_back(std::move(channel));
  c->thread = std::thread([this, c] { Serve(c); });
  return channel_id;
}

absl::Status ChannelStateReceiver::ExpectTicket(Ticket* ticket) { return ExpectFromDefaultPeer(ticket, nullptr); }

absl::Status ChannelStateReceiver::ExpectReservation(Ticket* ticket, PageSinkFactory reserved_slots) {
  ASSIGN_OR_RETURN(std::unique_ptr<PageSink> sink, reserved_slots());
  return ExpectFromDefaultPeer(ticket, std::move(sink));
}

absl::Status ChannelStateReceiver::ExpectFromDefaultPeer(Ticket* ticket, std::unique_ptr<PageSink> sink) {
  if (options_.default_peer.empty()) {
    return absl::FailedPreconditionError(
        "this channel receiver has no default prefill peer (ChannelReceiverOptions::default_peer): use ExpectFrom");
  }
  return ExpectFrom(options_.default_peer, ticket, std::move(sink));
}

absl::Status ChannelStateReceiver::ExpectFrom(absl::string_view peer, Ticket* ticket, std::unique_ptr<PageSink> sink) {
  ticket->kind = options_.kind;
  ASSIGN_OR_RETURN(ticket->secret, NewTransferSecret());
  ASSIGN_OR_RETURN(ticket->channel_id, ChannelFor(peer));
  if (sink == nullptr) return Expect(*ticket);
  const uint64_t id = ticket->transfer_id;
  {
    // Before Expect: a sender may begin as soon as the ticket is expected.
    absl::MutexLock lock(&sinks_mu_);
    if (sinks_.contains(id)) {
      return absl::InvalidArgumentError(absl::StrCat("transfer ", id, " already has its page slots"));
    }
    sinks_[id].sink = std::move(sink);
  }
  absl::Status expected = Expect(*ticket);
  if (!expected.ok()) {
    absl::MutexLock lock(&sinks_mu_);
    sinks_.erase(id);
  }
  return expected;
}

absl::Status ChannelStateReceiver::Expect(const Ticket& ticket) {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(ticket.channel_id);
  if (it == by_id_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", ticket.transfer_id, ": its channel id names no live channel (ChannelFor makes one)"));
  }
  RETURN_IF_ERROR(registry_.Expect(ticket));
  expected_on_[ticket.transfer_id] = it->second;
  return absl::OkStatus();
}

absl::StatusOr<ReceivedState> ChannelStateReceiver::Await(uint64_t transfer_id) {
  absl::StatusOr<ReceivedState> result = registry_.Await(transfer_id);
  RevokeSink(transfer_id);
  Unbind(transfer_id);
  return result;
}

void ChannelStateReceiver::Cancel(uint64_t transfer_id) {
  registry_.Cancel(transfer_id);
  RevokeSink(transfer_id);
  Unbind(transfer_id);
}

int64_t ChannelStateReceiver::channels() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(live_.size());
}

void ChannelStateReceiver::Unbind(uint64_t transfer_id) {
  absl::MutexLock lock(&mu_);
  expected_on_.erase(transfer_id);
}

bool ChannelStateReceiver::ExpectedElsewhere(uint64_t transfer_id, const Channel* channel) const {
  absl::MutexLock lock(&mu_);
  auto it = expected_on_.find(transfer_id);
  return it != expected_on_.end() && it->second != channel;
}

void ChannelStateReceiver::JoinFinished() {
  std::vector<std::unique_ptr<Channel>> done;
  {
    absl::MutexLock lock(&mu_);
    auto finished = [](const std::unique_ptr<Channel>& c) { return c->finished.load(); };
    for (auto& c : channels_) {
      if (finished(c)) done.push_back(std::move(c));
    }
    channels_.erase(std::remove(channels_.begin(), channels_.end(), nullptr), channels_.end());
  }
  for (auto& c : done) c->thread.join();
}

void ChannelStateReceiver::Fail(Channel* channel, const absl::Status& why, std::optional<uint64_t> serving) {
  if (channel->failed.exchange(true)) return;
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = live_.find(channel->peer); it != live_.end() && it->second == channel) live_.erase(it);
    by_id_.erase(channel->channel_id);
    for (const auto& [id, c] : expected_on_) {
      if (c == channel) ids.push_back(id);
    }
    for (uint64_t id : ids) expected_on_.erase(id);
  }
  channel->comm->Abort();
  if (serving.has_value()) registry_.Fail(*serving, AsTransferFailure(why, channel->peer));
  const absl::Status failure = absl::UnavailableError(
      absl::StrCat("the channel to ", channel->peer, " failed: ", AsTransferFailure(why, channel->peer).message()));
  for (uint64_t id : ids) registry_.Fail(id, failure);
}

void ChannelStateReceiver::Serve(Channel* channel) {
  Communicator& comm = *channel->comm;
  absl::Status s = comm.WaitReady(channel->join_deadline);
  while (s.ok()) {
    // Idle: the next transfer may be far off, and only Abort ends this wait.
    char raw[kFrameHeaderBytes];
    s = comm.Recv(raw, sizeof(raw), absl::InfiniteFuture());
    if (s.ok()) s = ServeTransfer(*channel, absl::string_view(raw, sizeof(raw)));
  }
  Fail(channel, s);
  channel->finished = true;
}

absl::Status ChannelStateReceiver::ServeTransfer(Channel& channel, absl::string_view raw) {
  Communicator& comm = *channel.comm;
  auto io_deadline = [this] { return absl::Now() + options_.io_timeout; };
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(raw);
  if (h.ok() && (h->type != FrameType::kBegin || !IsBeginPayloadSize(h->payload_bytes))) {
    h = absl::InvalidArgumentError(absl::StrCat("a transfer starts with a begin frame of ", kBeginPayloadBytes,
                                                " payload bytes (and an in-place offer), got type ",
                                                static_cast<int>(h->type), " of ", h->payload_bytes, " bytes"));
  }
  if (!h.ok()) {
    registry_.CountRefused();
    return h.status();  // nothing says how long the next message is
  }
  const uint64_t id = h->transfer_id;
  std::string payload(static_cast<size_t>(h->payload_bytes), '\0');
  RETURN_IF_ERROR(comm.Recv(payload.data(), payload.size(), io_deadline()));

  // The verdict, before any page moves.
  absl::Status verdict = CheckPayload(*h, payload);
  BeginPayload begin;
  std::vector<int64_t> offer;  // the in-place offer's region split; empty: staged only
  if (verdict.ok()) {
    const absl::string_view bytes(payload);
    absl::StatusOr<BeginPayload> decoded = DecodeBegin(bytes.substr(0, kBeginPayloadBytes));
    if (decoded.ok()) begin = *decoded;
    verdict = decoded.status();
    if (verdict.ok() && bytes.size() > kBeginPayloadBytes) {
      absl::StatusOr<std::vector<int64_t>> split = DecodeRegionOffer(bytes.substr(kBeginPayloadBytes));
      if (split.ok()) offer = *std::move(split);
      verdict = split.status();
    }
  }
  if (!verdict.ok()) {
    registry_.CountRefused();
  } else if (ExpectedElsewhere(id, &channel)) {
    registry_.CountRefused();
    verdict = absl::NotFoundError(absl::StrCat("transfer ", id, " is not expected from ", channel.peer));
  }
  bool begun = false;
  bool in_place = false;
  if (verdict.ok()) {
    // The secret is compared before the transfer is claimed. A begin without
    // it (an id not expected, or another secret: UNAUTHENTICATED, counted) is
    // answered, unlike on TCP: the peer proved the channel when it joined
    // (its id: channel_protocol.h), and the answer keeps the channel in step.
    // The transfer is untouched: its rightful sender can still begin it.
    absl::StatusOr<Ticket> ticket = registry_.Begin(id, begin.secret);  // counts what it refuses
    verdict = ticket.status();
    if (ticket.ok()) {
      begun = true;
      verdict = CheckBeginAgainstTicket(id, begin, *ticket);
      if (verdict.ok() && !offer.empty()) verdict = Placement(id, begin, offer, &in_place);
    }
  }
  if (begun && !verdict.ok()) {
    registry_.CountRefused();
    registry_.Fail(id, verdict);
  }
  RETURN_IF_ERROR(SendFrame(comm, FrameType::kAck, id, in_place ? kPlacementInPlace : kPlacementStaged,
                            EncodeAck(verdict), io_deadline()));
  if (!verdict.ok()) return absl::OkStatus();

  ReceivedState received;
  received.transfer_id = id;
  absl::Status outcome;
  if (absl::Status s = ReceiveBody(comm, begin, in_place ? &offer : nullptr, &received, &outcome); !s.ok()) {
    Fail(&channel, s, id);  // the channel is out of step
    return s;
  }
  if (outcome.ok()) {
    outcome = registry_.Complete(id, std::move(received));  // NOT_FOUND (counted) when forgotten meanwhile
  } else {
    if (absl::IsDataLoss(outcome)) registry_.CountRefused();
    registry_.Fail(id, outcome);
  }
  return SendFrame(comm, FrameType::kAck, id, 0, EncodeAck(outcome), io_deadline());
}

absl::Status ChannelStateReceiver::ReceiveBody(Communicator& comm, const BeginPayload& begin,
                                               const std::vector<int64_t>* split, ReceivedState* received,
                                               absl::Status* outcome) {
  auto io_deadline = [this] { return absl::Now() + options_.io_timeout; };
  const uint64_t id = received->transfer_id;
  if (split != nullptr) {
    RETURN_IF_ERROR(ReceivePagesInPlace(comm, begin, *split, received, outcome));
  } else {
    received->pages = PageBlock(begin.num_pages, begin.page_bytes);
    std::string page;
    for (int64_t i = 0; i < begin.num_pages; ++i) {
      ASSIGN_OR_RETURN(const bool arrived,
                       RecvFrame(comm, io_deadline(), FrameType::kPage, id, static_cast<uint64_t>(i),
                                 static_cast<uint64_t>(begin.page_bytes), &page, outcome));
      if (!arrived) return absl::OkStatus();
      std::memcpy(received->pages.mutable_page(i).data(), page.data(), page.size());
    }
  }
  ASSIGN_OR_RETURN(bool arrived, RecvFrame(comm, io_deadline(), FrameType::kState, id, 0,
                                           static_cast<uint64_t>(begin.state_bytes), &received->state, outcome));
  if (!arrived) return absl::OkStatus();
  std::string end;
  ASSIGN_OR_RETURN(arrived, RecvFrame(comm, io_deadline(), FrameType::kEnd, id, 0, kEndPayloadBytes, &end, outcome));
  if (!arrived || !outcome->ok()) return absl::OkStatus();
  absl::StatusOr<EndPayload> decoded = DecodeEnd(end);
  if (!decoded.ok()) {
    *outcome = decoded.status();
    return absl::OkStatus();
  }
  received->first_token = decoded->first_token;
  received->first_logprob = decoded->first_logprob;
  return absl::OkStatus();
}

absl::Status ChannelStateReceiver::ReceivePagesInPlace(Communicator& comm, const BeginPayload& begin,
                                                       const std::vector<int64_t>& split, ReceivedState* received,
                                                       absl::Status* outcome) {
  auto io_deadline = [this] { return absl::Now() + options_.io_timeout; };
  const uint64_t id = received->transfer_id;
  received->pages_in_place = true;
  received->num_pages_in_place = begin.num_pages;
  std::string scratch;  // where the pages of a transfer forgotten meanwhile go
  for (int64_t i = 0; i < begin.num_pages; ++i) {
    for (size_t r = 0; r < split.size(); ++r) {
      const size_t bytes = static_cast<size_t>(split[r]);
      void* dst = BeginSinkWrite(id, i, r);
      if (dst == nullptr) {
        // Cancelled or past its deadline: the slots may be someone else's now.
        if (outcome->ok()) {
          *outcome = absl::NotFoundError(
              absl::StrCat("transfer ", id, " was cancelled or passed its deadline: its pages are refused"));
        }
        scratch.resize(std::max(scratch.size(), bytes));
        RETURN_IF_ERROR(comm.Recv(scratch.data(), bytes, io_deadline()));
        continue;
      }
      const absl::Status s = comm.Recv(dst, bytes, io_deadline());
      EndSinkWrite(id);
      RETURN_IF_ERROR(s);
    }
  }
  const int64_t sampled = SampledPages(begin.num_pages);
  std::string sums;
  ASSIGN_OR_RETURN(const bool arrived, RecvFrame(comm, io_deadline(), FrameType::kPageSums, id, 0,
                                                 static_cast<uint64_t>(8 * sampled), &sums, outcome));
  if (!arrived) return absl::OkStatus();
  int64_t k = 0;
  for (int64_t i = 0; i < begin.num_pages; ++i) {
    if (!IsSampledPage(i, begin.num_pages)) continue;
    PageChecksum sum;
    sum.page = i;
    std::memcpy(&sum.checksum, sums.data() + 8 * k++, 8);  // little-endian, as every frame field
    received->page_checksums.push_back(sum);
  }
  return absl::OkStatus();
}

absl::Status ChannelStateReceiver::Placement(uint64_t transfer_id, const BeginPayload& begin,
                                             const std::vector<int64_t>& split, bool* in_place) {
  int64_t total = 0;
  for (int64_t bytes : split) total += bytes;
  if (total != begin.page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer_id, ": the sender's page regions (",
                                                   RegionSplitText(split), ") sum to ", total, " bytes, a page has ",
                                                   begin.page_bytes));
  }
  absl::MutexLock lock(&sinks_mu_);
  auto it = sinks_.find(transfer_id);
  if (it == sinks_.end() || it->second.revoked) {
    *in_place = false;  // no slots to write into: staged
    return absl::OkStatus();
  }
  const PageSink& sink = *it->second.sink;
  if (sink.num_pages() != begin.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer_id, ": ", begin.num_pages,
                                                   " pages announced, the receiver's slots hold ", sink.num_pages()));
  }
  for (int64_t i = 0; i < sink.num_pages(); ++i) {
    const std::vector<MemoryRegion>& regions = sink.PageRegions(i);
    bool same = regions.size() == split.size();
    for (size_t r = 0; same && r < regions.size(); ++r) same = static_cast<int64_t>(regions[r].bytes) == split[r];
    if (!same) {
      std::vector<int64_t> ours;
      for (const MemoryRegion& m : regions) ours.push_back(static_cast<int64_t>(m.bytes));
      return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer_id, ": the sender splits a page into ",
                                                     split.size(), " regions (", RegionSplitText(split),
                                                     "), the receiver's page ", i, " slot into ", regions.size(), " (",
                                                     RegionSplitText(ours), ")"));
    }
  }
  *in_place = true;
  return absl::OkStatus();
}

void* ChannelStateReceiver::BeginSinkWrite(uint64_t transfer_id, int64_t page, size_t region) {
  absl::MutexLock lock(&sinks_mu_);
  auto it = sinks_.find(transfer_id);
  if (it == sinks_.end() || it->second.revoked) return nullptr;
  it->second.writing = true;
  return it->second.sink->PageRegions(page)[region].data;
}

void ChannelStateReceiver::EndSinkWrite(uint64_t transfer_id) {
  absl::MutexLock lock(&sinks_mu_);
  auto it = sinks_.find(transfer_id);
  if (it != sinks_.end()) it->second.writing = false;
}

void ChannelStateReceiver::RevokeSink(uint64_t transfer_id) {
  std::unique_ptr<PageSink> sink;  // destroyed outside the lock
  absl::MutexLock lock(&sinks_mu_);
  auto it = sinks_.find(transfer_id);
  if (it == sinks_.end()) return;
  it->second.revoked = true;
  SinkHold* hold = &it->second;
  auto idle = [hold] { return !hold->writing; };
  sinks_mu_.Await(absl::Condition(&idle));  // one message at most: bounded by io_timeout
  sink = std::move(sinks_.find(transfer_id)->second.sink);
  sinks_.erase(transfer_id);
}

}  // namespace hybridserve::transport
