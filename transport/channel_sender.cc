#include "transport/channel_sender.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "transport/channel_protocol.h"
#include "transport/frame.h"

namespace hybridserve::transport {

struct ChannelStateSender::InPlacePages {
  std::vector<int64_t> split;                    // region bytes, the same for every page
  std::vector<std::vector<MemoryRegion>> pages;  // [num_pages]
  std::string sums;                              // kPageSums payload
};

absl::StatusOr<std::unique_ptr<ChannelStateSender::InPlacePages>> ChannelStateSender::ResolveInPlace(
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
                                                   RegionSplitText(in_place->split), ") do not split a page of ",
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

struct ChannelStateSender::Channel {
  std::string channel_id;
  std::unique_ptr<Communicator> comm;
  absl::Mutex mu;
  bool busy ABSL_GUARDED_BY(mu) = false;  // a Send holds the channel
};

ChannelStateSender::~ChannelStateSender() = default;

int64_t ChannelStateSender::channels() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(channels_.size());
}

absl::StatusOr<std::shared_ptr<ChannelStateSender::Channel>> ChannelStateSender::ChannelFor(const Ticket& ticket) {
  absl::MutexLock lock(&mu_);
  if (std::find(retired_.begin(), retired_.end(), ticket.channel_id) != retired_.end()) {
    return absl::UnavailableError(absl::StrCat("transfer ", ticket.transfer_id, ": the channel of its ticket to ",
                                               ticket.endpoint, " has failed or been replaced"));
  }
  auto it = channels_.find(ticket.endpoint);
  if (it != channels_.end() && it->second->channel_id == ticket.channel_id) return it->second;
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, factory_.Join(ticket.channel_id, /*rank=*/1));
  auto channel = std::make_shared<Channel>();
  channel->channel_id = ticket.channel_id;
  channel->comm = std::move(comm);
  if (it != channels_.end()) {
    // The receiver made a new channel: it has given up the old one.
    Retire(it->second->channel_id);
    it->second->comm->Abort();
    it->second = channel;
  } else {
    channels_[ticket.endpoint] = channel;
  }
  return channel;
}

void ChannelStateSender::Retire(const std::string& channel_id) {
  retired_.push_back(channel_id);
  if (retired_.size() > kMaxRetired) retired_.pop_front();
}

void ChannelStateSender::Drop(const std::string& endpoint, const std::shared_ptr<Channel>& channel) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = channels_.find(endpoint); it != channels_.end() && it->second == channel) {
      Retire(channel->channel_id);
      channels_.erase(it);
    }
  }
  channel->comm->Abort();
}

absl::Status ChannelStateSender::Send(const Ticket& ticket, const StateSource& source) {
  const uint64_t id = ticket.transfer_id;
  if (source.num_pages() != ticket.num_pages || source.page_bytes() != ticket.page_bytes ||
      static_cast<int64_t>(source.state().size()) > ticket.max_state_bytes || source.state().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", id, ": ", source.num_pages(), " pages of ",
                                                   source.page_bytes(), " bytes and a state of ", source.state().size(),
                                                   " bytes do not fit the ticket"));
  }
  if (ticket.endpoint.empty() || ticket.channel_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", id, ": a channel ticket needs an endpoint and a channel id"));
  }
  if (ticket.held_pages != 0) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", id, ": the ticket says the receiver holds ",
                                                   ticket.held_pages,
                                                   " pages; the channel planes send every page (transfer.h)"));
  }
  if (ticket.secret.size() != kTransferSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", id, ": a ticket secret of ", ticket.secret.size(),
                                                   " bytes, ", kTransferSecretBytes, " expected"));
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
  if (!s.ok() && (channel_failed || absl::IsNotFound(s) || absl::IsUnauthenticated(s)) &&
      absl::Now() >= ticket.deadline) {
    // The receiver forgot the transfer at its deadline, or the channel gave up past it.
    return absl::DeadlineExceededError(absl::StrCat("transfer ", id, " passed its deadline: ", s.message()));
  }
  return s;
}

absl::Status ChannelStateSender::Transfer(Communicator& comm, const Ticket& ticket, const StateSource& source,
                                          const InPlacePages* in_place, bool* channel_failed) {
  const uint64_t id = ticket.transfer_id;
  auto io_deadline = [this] { return absl::Now() + options_.io_timeout; };
  auto failed = [&](const absl::Status& s) {
    *channel_failed = true;
    return absl::UnavailableError(
        absl::StrCat("transfer ", id, ": the channel to ", ticket.endpoint, " failed: ", s.ToString()));
  };
  if (absl::Status s = comm.WaitReady(std::min(ticket.deadline, absl::Now() + options_.join_timeout)); !s.ok()) {
    return failed(s);
  }
  std::string begin_payload = EncodeBegin(BeginOf(ticket, source));
  if (in_place != nullptr) begin_payload += EncodeRegionOffer(in_place->split);
  if (absl::Status s = SendFrame(comm, FrameType::kBegin, id, 0, begin_payload, io_deadline()); !s.ok()) {
    return failed(s);
  }
  absl::Status verdict;
  uint64_t placement = kPlacementStaged;
  if (absl::Status s = RecvAck(comm, id, io_deadline(), &verdict, &placement); !s.ok()) return failed(s);
  if (!verdict.ok()) return verdict;  // refused before any page moved; the channel is in step
  if (placement != kPlacementStaged && (placement != kPlacementInPlace || in_place == nullptr)) {
    return failed(absl::InvalidArgumentError(absl::StrCat("a verdict with placement ", placement, " to an offer ",
                                                          in_place == nullptr ? "not made" : "made")));
  }

  if (placement == kPlacementInPlace) {
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
  std::string page(static_cast<size_t>(placement == kPlacementStaged ? source.page_bytes() : 0), '\0');  // host staging
  for (int64_t i = 0; placement == kPlacementStaged && i < source.num_pages(); ++i) {
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
