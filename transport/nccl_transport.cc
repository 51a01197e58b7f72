#include "transport/nccl_transport.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

// Receives the ack of `transfer_id` into `*carried`. Errors are the channel's.
absl::Status RecvAck(Communicator& comm, uint64_t transfer_id, absl::Time deadline, absl::Status* carried) {
  ASSIGN_OR_RETURN(const FrameHeader h, RecvHeader(comm, deadline));
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

absl::Status NcclStateReceiver::ExpectTicket(Ticket* ticket) {
  if (options_.default_peer.empty()) {
    return absl::FailedPreconditionError(
        "this NCCL receiver has no default prefill peer (NcclReceiverOptions::default_peer): use ExpectFrom");
  }
  return ExpectFrom(options_.default_peer, ticket);
}

absl::Status NcclStateReceiver::ExpectFrom(absl::string_view peer, Ticket* ticket) {
  ticket->kind = options_.kind;
  ASSIGN_OR_RETURN(ticket->nccl_unique_id, ChannelFor(peer));
  return Expect(*ticket);
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
  Unbind(transfer_id);
  return result;
}

void NcclStateReceiver::Cancel(uint64_t transfer_id) {
  registry_.Cancel(transfer_id);
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

void NcclStateReceiver::Fail(Channel* channel, const absl::Status& why) {
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
  if (h.ok() && (h->type != FrameType::kBegin || h->payload_bytes != kBeginPayloadBytes)) {
    h = absl::InvalidArgumentError(absl::StrCat("a transfer starts with a begin frame of ", kBeginPayloadBytes,
                                                " payload bytes, got type ", static_cast<int>(h->type), " of ",
                                                h->payload_bytes, " bytes"));
  }
  if (!h.ok()) {
    registry_.CountRefused();
    return h.status();  // nothing says how long the next message is
  }
  const uint64_t id = h->transfer_id;
  std::string payload(kBeginPayloadBytes, '\0');
  RETURN_IF_ERROR(comm.Recv(payload.data(), payload.size(), io_deadline()));

  // The verdict, before any page moves.
  absl::Status verdict = CheckPayload(*h, payload);
  BeginPayload begin;
  if (verdict.ok()) {
    absl::StatusOr<BeginPayload> decoded = DecodeBegin(payload);
    if (decoded.ok()) begin = *decoded;
    verdict = decoded.status();
  }
  if (!verdict.ok()) {
    registry_.CountRefused();
  } else if (ExpectedElsewhere(id, &channel)) {
    registry_.CountRefused();
    verdict = absl::NotFoundError(absl::StrCat("transfer ", id, " is not expected from ", channel.peer));
  }
  bool begun = false;
  if (verdict.ok()) {
    absl::StatusOr<Ticket> ticket = registry_.Begin(id);  // counts the ids it refuses
    verdict = ticket.status();
    if (ticket.ok()) {
      begun = true;
      verdict = CheckBeginAgainstTicket(id, begin, *ticket);
    }
  }
  if (begun && !verdict.ok()) {
    registry_.CountRefused();
    registry_.Fail(id, verdict);
  }
  RETURN_IF_ERROR(SendFrame(comm, FrameType::kAck, id, 0, EncodeAck(verdict), io_deadline()));
  if (!verdict.ok()) return absl::OkStatus();

  ReceivedState received;
  received.transfer_id = id;
  absl::Status outcome;
  if (absl::Status s = ReceiveBody(comm, begin, &received, &outcome); !s.ok()) {
    registry_.Fail(id, AsTransferFailure(s, channel.peer));
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

absl::Status NcclStateReceiver::ReceiveBody(Communicator& comm, const BeginPayload& begin, ReceivedState* received,
                                            absl::Status* outcome) {
  auto io_deadline = [this] { return absl::Now() + options_.io_timeout; };
  const uint64_t id = received->transfer_id;
  received->pages = PageBlock(begin.num_pages, begin.page_bytes);
  std::string page;
  for (int64_t i = 0; i < begin.num_pages; ++i) {
    ASSIGN_OR_RETURN(const bool arrived, RecvFrame(comm, io_deadline(), FrameType::kPage, id, static_cast<uint64_t>(i),
                                                   static_cast<uint64_t>(begin.page_bytes), &page, outcome));
    if (!arrived) return absl::OkStatus();
    std::memcpy(received->pages.mutable_page(i).data(), page.data(), page.size());
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

// ---- Sender ----

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
  absl::Status s = Transfer(*c->comm, ticket, source, &channel_failed);
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
                                       bool* channel_failed) {
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
  if (absl::Status s = SendFrame(comm, FrameType::kBegin, id, 0, EncodeBegin(begin), io_deadline()); !s.ok()) {
    return failed(s);
  }
  absl::Status verdict;
  if (absl::Status s = RecvAck(comm, id, io_deadline(), &verdict); !s.ok()) return failed(s);
  if (!verdict.ok()) return verdict;  // refused before any page moved; the channel is in step

  std::string page(static_cast<size_t>(source.page_bytes()), '\0');  // host staging (see the header)
  for (int64_t i = 0; i < source.num_pages(); ++i) {
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
