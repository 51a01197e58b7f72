#include "transport/nccl_transport.h"

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
#include "common/hash.h"
#include "common/status_macros.h"

namespace hybridserve::transport {
namespace {

absl::Status SendFrame(Communicator& comm, FrameType type, uint64_t transfer_id, uint64_t index,
                       absl::string_view payload, absl::Time deadline) {
  const std::string header = EncodeFrameHeader(type, transfer_id, index, payload);
  RETURN_IF_ERROR(comm.Send(header.data(), header.size(), deadline));
  if (payload.empty()) return absl::OkStatus();
  return comm.Send(payload.data(), payload.size(), deadline);
}

absl::StatusOr<FrameHeader> RecvHeader(Communicator& comm, absl::Time deadline) {
  char raw[kFrameHeaderBytes];
  RETURN_IF_ERROR(comm.Recv(raw, sizeof(raw), deadline));
  return DecodeFrameHeader(absl::string_view(raw, sizeof(raw)));
}

// The payload of an ack whose header `h` arrived. Errors are the channel's.
absl::Status RecvAckPayload(Communicator& comm, const FrameHeader& h, absl::Time deadline, absl::Status* carried) {
  if (h.payload_bytes < 4 || h.payload_bytes > 4 + kMaxAckMessage) {
    return absl::InvalidArgumentError(absl::StrCat("ack of ", h.payload_bytes, " payload bytes"));
  }
  std::string payload(static_cast<size_t>(h.payload_bytes), '\0');
  RETURN_IF_ERROR(comm.Recv(payload.data(), payload.size(), deadline));
  RETURN_IF_ERROR(CheckPayload(h, payload));
  return DecodeAck(payload, carried);
}

// Receives the ack of `transfer_id` into `*carried` (and its header's index
// into `*index` when set). Errors are the channel's.
absl::Status RecvAck(Communicator& comm, uint64_t transfer_id, absl::Time deadline, absl::Status* carried,
                     uint64_t* index = nullptr) {
  ASSIGN_OR_RETURN(const FrameHeader h, RecvHeader(comm, deadline));
  if (index != nullptr) *index = h.index;
  if (h.type != FrameType::kAck || h.transfer_id != transfer_id) {
    return absl::InvalidArgumentError(absl::StrCat("expected the ack of transfer ", transfer_id, ", got frame type ",
                                                   static_cast<int>(h.type), " of transfer ", h.transfer_id));
  }
  return RecvAckPayload(comm, h, deadline, carried);
}

// Receives frame (type, transfer_id, index) with `payload_bytes` of payload
// into `*payload`: true when it arrived (a payload that fails its checksum
// sets `*outcome` if still OK), false when the sender sent its own failure
// in its place (in `*outcome` if still OK). Errors are the channel's.
absl::StatusOr<bool> RecvFrame(Communicator& comm, absl::Time deadline, FrameType type, uint64_t transfer_id,
                               uint64_t index, uint64_t payload_bytes, std::string* payload, absl::Status* outcome) {
  ASSIGN_OR_RETURN(const FrameHeader h, RecvHeader(comm, deadline));
  if (h.type == FrameType::kAck && h.transfer_id == transfer_id) {
    absl::Status carried;
    RETURN_IF_ERROR(RecvAckPayload(comm, h, deadline, &carried));
    if (outcome->ok()) {
      *outcome = absl::UnavailableError(absl::StrCat("the sender gave up transfer ", transfer_id, ": ",
                                                     carried.ok() ? "no reason given" : carried.ToString()));
    }
    return false;
  }
  if (h.type != type || h.transfer_id != transfer_id || h.index != index || h.payload_bytes != payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer_id, ": expected frame type ",
                                                   static_cast<int>(type), " index ", index, " of ", payload_bytes,
                                                   " bytes, got type ", static_cast<int>(h.type), " index ", h.index,
                                                   " of ", h.payload_bytes, " bytes of transfer ", h.transfer_id));
  }
  payload->assign(static_cast<size_t>(payload_bytes), '\0');
  if (payload_bytes > 0) RETURN_IF_ERROR(comm.Recv(payload->data(), payload->size(), deadline));
  if (absl::Status s = CheckPayload(h, *payload); !s.ok() && outcome->ok()) {
    *outcome = absl::DataLossError(absl::StrCat("transfer ", transfer_id, ": ", s.message()));
  }
  return true;
}

// A channel failure as the transfer that was on it sees it: a stall reads as
// the peer gone.
absl::Status AsTransferFailure(const absl::Status& channel, absl::string_view peer) {
  if (absl::IsDeadlineExceeded(channel)) {
    return absl::UnavailableError(absl::StrCat("NCCL peer ", peer, " stalled: ", channel.message()));
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

// The placement a verdict's header index announces.
constexpr uint64_t kStaged = 0;
constexpr uint64_t kInPlace = 1;

std::string SplitString(const std::vector<int64_t>& split) {
  std::string s;
  for (size_t r = 0; r < split.size(); ++r) absl::StrAppend(&s, r == 0 ? "" : ",", split[r]);
  return s;
}

}  // namespace

// ---- Receiver ----

struct NcclStateReceiver::Channel {
  std::string peer;
  std::string unique_id;
  std::unique_ptr<Communicator> comm;
  absl::Time join_deadline;
  std::thread thread;
  std::atomic<bool> failed{false};    // set once by Fail
  std::atomic<bool> finished{false};  // its thread is done: JoinFinished may join it
};

absl::StatusOr<std::unique_ptr<NcclStateReceiver>> NcclStateReceiver::Create(CommunicatorFactory& factory,
                                                                             const NcclReceiverOptions& options) {
  if (options.io_timeout <= absl::ZeroDuration() || options.join_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NCCL receiver: io_timeout and join_timeout must be positive");
  }
  return std::unique_ptr<NcclStateReceiver>(new NcclStateReceiver(factory, options));
}

NcclStateReceiver::NcclStateReceiver(CommunicatorFactory& factory, const NcclReceiverOptions& options)
    : factory_(factory), options_(options), registry_(options.limits) {}

NcclStateReceiver::~NcclStateReceiver() {
  std::vector<std::unique_ptr<Channel>> all;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    all.swap(channels_);
  }
  for (auto& c : all) c->comm->Abort();  // wakes its thread, which fails the channel
  for (auto& c : all) c->thread.join();
}

absl::StatusOr<std::string> NcclStateReceiver::ChannelFor(absl::string_view peer) {
  JoinFinished();
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("NCCL receiver is shutting down");
  if (auto it = live_.find(peer); it != live_.end()) return it->second->unique_id;
  ASSIGN_OR_RETURN(std::string unique_id, factory_.NewUniqueId());
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, factory_.Join(unique_id, /*rank=*/0));
  auto channel = std::make_unique<Channel>();
  channel->peer = std::string(peer);
  channel->unique_id = unique_id;
  channel->comm = std::move(comm);
  channel->join_deadline = absl::Now() + options_.join_timeout;
  Channel* c = channel.get();
  live_[c->peer] = c;
  by_id_[c->unique_id] = c;
  channels_.push_back(std::move(channel));
  c->thread = std::thread([this, c] { Serve(c); });
  return unique_id;
}

absl::Status NcclStateReceiver::ExpectTicket(Ticket* ticket) { return ExpectTicketInPlace(ticket, nullptr); }

absl::Status NcclStateReceiver::ExpectTicketInPlace(Ticket* ticket, std::unique_ptr<PageSink> sink) {
  if (options_.default_peer.empty()) {
    return absl::FailedPreconditionError(
        "this NCCL receiver has no default prefill peer (NcclReceiverOptions::default_peer): use ExpectFrom");
  }
  return ExpectFrom(options_.default_peer, ticket, std::move(sink));
}

absl::Status NcclStateReceiver::ExpectFrom(absl::string_view peer, Ticket* ticket, std::unique_ptr<PageSink> sink) {
  ticket->kind = options_.kind;
  ASSIGN_OR_RETURN(ticket->nccl_unique_id, ChannelFor(peer));
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

absl::Status NcclStateReceiver::Expect(const Ticket& ticket) {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(ticket.nccl_unique_id);
  if (it == by_id_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", ticket.transfer_id, ": its NCCL unique id names no live channel (ChannelFor makes one)"));
  }
  RETURN_IF_ERROR(registry_.Expect(ticket));
  expected_on_[ticket.transfer_id] = it->second;
  return absl::OkStatus();
}

absl::StatusOr<ReceivedState> NcclStateReceiver::Await(uint64_t transfer_id) {
  absl::StatusOr<ReceivedState> result = registry_.Await(transfer_id);
  RevokeSink(transfer_id);
  Unbind(transfer_id);
  return result;
}

void NcclStateReceiver::Cancel(uint64_t transfer_id) {
  registry_.Cancel(transfer_id);
  RevokeSink(transfer_id);
  Unbind(transfer_id);
}

int64_t NcclStateReceiver::channels() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(live_.size());
}

void NcclStateReceiver::Unbind(uint64_t transfer_id) {
  absl::MutexLock lock(&mu_);
  expected_on_.erase(transfer_id);
}

bool NcclStateReceiver::ExpectedElsewhere(uint64_t transfer_id, const Channel* channel) const {
  absl::MutexLock lock(&mu_);
  auto it = expected_on_.find(transfer_id);
  return it != expected_on_.end() && it->second != channel;
}

void NcclStateReceiver::JoinFinished() {
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

void NcclStateReceiver::Fail(Channel* channel, const absl::Status& why, std::optional<uint64_t> serving) {
  if (channel->failed.exchange(true)) return;
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = live_.find(channel->peer); it != live_.end() && it->second == channel) live_.erase(it);
    by_id_.erase(channel->unique_id);
    for (const auto& [id, c] : expected_on_) {
      if (c == channel) ids.push_back(id);
    }
    for (uint64_t id : ids) expected_on_.erase(id);
  }
  channel->comm->Abort();
  if (serving.has_value()) registry_.Fail(*serving, AsTransferFailure(why, channel->peer));
  const absl::Status failure = absl::UnavailableError(absl::StrCat(
      "the NCCL channel to ", channel->peer, " failed: ", AsTransferFailure(why, channel->peer).message()));
  for (uint64_t id : ids) registry_.Fail(id, failure);
}

void NcclStateReceiver::Serve(Channel* channel) {
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

absl::Status NcclStateReceiver::ServeTransfer(Channel& channel, absl::string_view raw) {
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
    absl::StatusOr<Ticket> ticket = registry_.Begin(id);  // counts the ids it refuses
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
  RETURN_IF_ERROR(
      SendFrame(comm, FrameType::kAck, id, in_place ? kInPlace : kStaged, EncodeAck(verdict), io_deadline()));
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

absl::Status NcclStateReceiver::ReceiveBody(Communicator& comm, const BeginPayload& begin,
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

absl::Status NcclStateReceiver::ReceivePagesInPlace(Communicator& comm, const BeginPayload& begin,
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

absl::Status NcclStateReceiver::Placement(uint64_t transfer_id, const BeginPayload& begin,
                                          const std::vector<int64_t>& split, bool* in_place) {
  int64_t total = 0;
  for (int64_t bytes : split) total += bytes;
  if (total != begin.page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer_id, ": the sender's page regions (",
                                                   SplitString(split), ") sum to ", total, " bytes, a page has ",
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
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer ", transfer_id, ": the sender splits a page into ", split.size(), " regions (", SplitString(split),
          "), the receiver's page ", i, " slot into ", regions.size(), " (", SplitString(ours), ")"));
    }
  }
  *in_place = true;
  return absl::OkStatus();
}

void* NcclStateReceiver::BeginSinkWrite(uint64_t transfer_id, int64_t page, size_t region) {
  absl::MutexLock lock(&sinks_mu_);
  auto it = sinks_.find(transfer_id);
  if (it == sinks_.end() || it->second.revoked) return nullptr;
  it->second.writing = true;
  return it->second.sink->PageRegions(page)[region].data;
}

void NcclStateReceiver::EndSinkWrite(uint64_t transfer_id) {
  absl::MutexLock lock(&sinks_mu_);
  auto it = sinks_.find(transfer_id);
  if (it != sinks_.end()) it->second.writing = false;
}

void NcclStateReceiver::RevokeSink(uint64_t transfer_id) {
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

// ---- Sender ----

struct NcclStateSender::InPlacePages {
  std::vector<int64_t> split;                    // region bytes, the same for every page
  std::vector<std::vector<MemoryRegion>> pages;  // [num_pages]
  std::string sums;                              // kPageSums payload
};

absl::StatusOr<std::unique_ptr<NcclStateSender::InPlacePages>> NcclStateSender::ResolveInPlace(
    uint64_t transfer_id, const StateSource& source) {
  const int64_t n = source.num_pages();
  if (n == 0) return nullptr;
  absl::StatusOr<std::vector<MemoryRegion>> first = source.PageRegions(0);
  if (absl::IsUnimplemented(first.status())) return nullptr;  // staged
  RETURN_IF_ERROR(first.status());
  auto in_place = std::make_unique<InPlacePages>();
  for (const MemoryRegion& r : *first) in_place->split.push_back(static_cast<int64_t>(r.bytes));
  int64_t total = 0;
  for (int64_t bytes : in_place->split) total += bytes;
  if (in_place->split.empty() || in_place->split.size() > kMaxPageRegions || total != source.page_bytes() ||
      std::find(in_place->split.begin(), in_place->split.end(), 0) != in_place->split.end()) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", transfer_id, ": the source's page regions (",
                                                   SplitString(in_place->split), ") do not split a page of ",
                                                   source.page_bytes(), " bytes"));
  }
  in_place->pages.reserve(static_cast<size_t>(n));
  in_place->pages.push_back(*std::move(first));
  for (int64_t i = 1; i < n; ++i) {
    ASSIGN_OR_RETURN(std::vector<MemoryRegion> regions, source.PageRegions(i));
    bool same = regions.size() == in_place->split.size();
    for (size_t r = 0; same && r < regions.size(); ++r) {
      same = static_cast<int64_t>(regions[r].bytes) == in_place->split[r];
    }
    if (!same) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer ", transfer_id, ": page ", i, "'s regions differ from page 0's"));
    }
    in_place->pages.push_back(std::move(regions));
  }
  // The sampled pages' checksums, from a host copy (the channel never sees
  // the bytes on the host).
  std::string page(static_cast<size_t>(source.page_bytes()), '\0');
  for (int64_t i = 0; i < n; ++i) {
    if (!IsSampledPage(i, n)) continue;
    RETURN_IF_ERROR(source.ReadPage(i, absl::MakeSpan(page)));
    const uint64_t sum = common::Checksum64(page.data(), page.size());
    in_place->sums.append(reinterpret_cast<const char*>(&sum), sizeof(sum));  // little-endian
  }
  return in_place;
}

struct NcclStateSender::Channel {
  std::string unique_id;
  std::unique_ptr<Communicator> comm;
  absl::Mutex mu;
  bool busy ABSL_GUARDED_BY(mu) = false;  // a Send holds the channel
};

NcclStateSender::~NcclStateSender() = default;

int64_t NcclStateSender::channels() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(channels_.size());
}

absl::StatusOr<std::shared_ptr<NcclStateSender::Channel>> NcclStateSender::ChannelFor(const Ticket& ticket) {
  absl::MutexLock lock(&mu_);
  if (std::find(retired_.begin(), retired_.end(), ticket.nccl_unique_id) != retired_.end()) {
    return absl::UnavailableError(absl::StrCat("transfer ", ticket.transfer_id, ": the NCCL channel of its ticket to ",
                                               ticket.endpoint, " has failed or been replaced"));
  }
  auto it = channels_.find(ticket.endpoint);
  if (it != channels_.end() && it->second->unique_id == ticket.nccl_unique_id) return it->second;
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, factory_.Join(ticket.nccl_unique_id, /*rank=*/1));
  auto channel = std::make_shared<Channel>();
  channel->unique_id = ticket.nccl_unique_id;
  channel->comm = std::move(comm);
  if (it != channels_.end()) {
    // The receiver made a new channel: it has given up the old one.
    Retire(it->second->unique_id);
    it->second->comm->Abort();
    it->second = channel;
  } else {
    channels_[ticket.endpoint] = channel;
  }
  return channel;
}

void NcclStateSender::Retire(const std::string& unique_id) {
  retired_.push_back(unique_id);
  if (retired_.size() > kMaxRetired) retired_.pop_front();
}

void NcclStateSender::Drop(const std::string& endpoint, const std::shared_ptr<Channel>& channel) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = channels_.find(endpoint); it != channels_.end() && it->second == channel) {
      Retire(channel->unique_id);
      channels_.erase(it);
    }
  }
  channel->comm->Abort();
}

absl::Status NcclStateSender::Send(const Ticket& ticket, const StateSource& source) {
  const uint64_t id = ticket.transfer_id;
  if (source.num_pages() != ticket.num_pages || source.page_bytes() != ticket.page_bytes ||
      static_cast<int64_t>(source.state().size()) > ticket.max_state_bytes || source.state().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", id, ": ", source.num_pages(), " pages of ",
                                                   source.page_bytes(), " bytes and a state of ", source.state().size(),
                                                   " bytes do not fit the ticket"));
  }
  if (ticket.endpoint.empty() || ticket.nccl_unique_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", id, ": an NCCL ticket needs an endpoint and a unique id"));
  }
  if (absl::Now() >= ticket.deadline) {
    return absl::DeadlineExceededError(absl::StrCat("transfer ", id, " is past its deadline"));
  }
  // Pages in place are resolved (and the sampled ones checksummed) before
  // the channel is touched: a failure here sends nothing.
  ASSIGN_OR_RETURN(const std::unique_ptr<InPlacePages> in_place, ResolveInPlace(id, source));
  ASSIGN_OR_RETURN(const std::shared_ptr<Channel> channel, ChannelFor(ticket));
  Channel* c = channel.get();
  {
    absl::MutexLock lock(&c->mu);
    auto idle = [c]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) { return !c->busy; };
    if (!c->mu.AwaitWithDeadline(absl::Condition(&idle), ticket.deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("transfer ", id, " waited past its deadline for the channel to ", ticket.endpoint));
    }
    c->busy = true;
  }
  bool channel_failed = false;
  absl::Status s = Transfer(*c->comm, ticket, source, in_place.get(), &channel_failed);
  {
    absl::MutexLock lock(&c->mu);
    c->busy = false;
  }
  if (channel_failed) Drop(ticket.endpoint, channel);
  if (!s.ok() && (channel_failed || absl::IsNotFound(s)) && absl::Now() >= ticket.deadline) {
    // The receiver forgot the transfer at its deadline, or the channel gave up past it.
    return absl::DeadlineExceededError(absl::StrCat("transfer ", id, " passed its deadline: ", s.message()));
  }
  return s;
}

absl::Status NcclStateSender::Transfer(Communicator& comm, const Ticket& ticket, const StateSource& source,
                                       const InPlacePages* in_place, bool* channel_failed) {
  const uint64_t id = ticket.transfer_id;
  auto io_deadline = [this] { return absl::Now() + options_.io_timeout; };
  auto failed = [&](const absl::Status& s) {
    *channel_failed = true;
    return absl::UnavailableError(
        absl::StrCat("transfer ", id, ": the NCCL channel to ", ticket.endpoint, " failed: ", s.ToString()));
  };
  if (absl::Status s = comm.WaitReady(std::min(ticket.deadline, absl::Now() + options_.join_timeout)); !s.ok()) {
    return failed(s);
  }
  BeginPayload begin;
  begin.n_tokens = ticket.n_tokens;
  begin.page_format = ticket.page_format;
  begin.num_pages = source.num_pages();
  begin.page_bytes = source.page_bytes();
  begin.state_bytes = static_cast<int64_t>(source.state().size());
  std::string begin_payload = EncodeBegin(begin);
  if (in_place != nullptr) begin_payload += EncodeRegionOffer(in_place->split);
  if (absl::Status s = SendFrame(comm, FrameType::kBegin, id, 0, begin_payload, io_deadline()); !s.ok()) {
    return failed(s);
  }
  absl::Status verdict;
  uint64_t placement = kStaged;
  if (absl::Status s = RecvAck(comm, id, io_deadline(), &verdict, &placement); !s.ok()) return failed(s);
  if (!verdict.ok()) return verdict;  // refused before any page moved; the channel is in step
  if (placement != kStaged && (placement != kInPlace || in_place == nullptr)) {
    return failed(absl::InvalidArgumentError(absl::StrCat("a verdict with placement ", placement, " to an offer ",
                                                          in_place == nullptr ? "not made" : "made")));
  }

  if (placement == kInPlace) {
    // A request's pages as one run of messages, straight from the source's memory.
    for (const std::vector<MemoryRegion>& regions : in_place->pages) {
      for (const MemoryRegion& r : regions) {
        if (absl::Status s = comm.Send(r.data, r.bytes, io_deadline()); !s.ok()) return failed(s);
      }
    }
    if (absl::Status s = SendFrame(comm, FrameType::kPageSums, id, 0, in_place->sums, io_deadline()); !s.ok()) {
      return failed(s);
    }
  }
  std::string page(static_cast<size_t>(placement == kStaged ? source.page_bytes() : 0), '\0');  // host staging
  for (int64_t i = 0; placement == kStaged && i < source.num_pages(); ++i) {
    if (absl::Status read = source.ReadPage(i, absl::MakeSpan(page)); !read.ok()) {
      // Our failure in place of the page keeps the channel in step.
      if (absl::Status s = SendFrame(comm, FrameType::kAck, id, 0, EncodeAck(read), io_deadline()); !s.ok()) {
        return failed(s);
      }
      absl::Status answer;
      if (absl::Status s = RecvAck(comm, id, io_deadline(), &answer); !s.ok()) return failed(s);
      return read;
    }
    if (absl::Status s = SendFrame(comm, FrameType::kPage, id, static_cast<uint64_t>(i), page, io_deadline());
        !s.ok()) {
      return failed(s);
    }
  }
  if (absl::Status s = SendFrame(comm, FrameType::kState, id, 0, source.state(), io_deadline()); !s.ok()) {
    return failed(s);
  }
  EndPayload end;
  end.first_token = source.first_token();
  end.first_logprob = source.first_logprob();
  if (absl::Status s = SendFrame(comm, FrameType::kEnd, id, 0, EncodeEnd(end), io_deadline()); !s.ok()) {
    return failed(s);
  }
  absl::Status outcome;
  if (absl::Status s = RecvAck(comm, id, io_deadline(), &outcome); !s.ok()) return failed(s);
  return outcome;
}

}  // namespace hybridserve::transport
