#ifndef HYBRIDSERVE_TRANSPORT_CHANNEL_SENDER_H_
#define HYBRIDSERVE_TRANSPORT_CHANNEL_SENDER_H_

// The prefill side of the channel data plane (NCCL or CUDA IPC; the
// protocol, channels and deadlines are in transport/channel_protocol.h): a
// StateSender that keeps one channel per receiver endpoint, joined as rank 1
// with the channel id its tickets carry.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/communicator.h"
#include "transport/transfer.h"

namespace hybridserve::transport {

struct ChannelSenderOptions {
  // The longest wait for one message, the verdict or the final ack.
  absl::Duration io_timeout = absl::Seconds(10);
  // The longest wait for the receiver's end of a new channel (also bounded
  // by the ticket's deadline).
  absl::Duration join_timeout = absl::Seconds(30);
};

// Thread-safe.
class ChannelStateSender final : public StateSender {
 public:
  // `factory` must outlive the sender.
  explicit ChannelStateSender(CommunicatorFactory& factory, const ChannelSenderOptions& options = {})
      : factory_(factory), options_(options) {}
  ~ChannelStateSender() override;

  // As StateSender; INVALID_ARGUMENT also for a ticket without an endpoint
  // or a channel id. Concurrent Sends to one receiver queue behind each
  // other (until their ticket's deadline). Offers the pages in place when
  // the source names their regions; the error of PageRegions or of reading
  // a sampled page, before any message, when it cannot.
  absl::Status Send(const Ticket& ticket, const StateSource& source) ABSL_LOCKS_EXCLUDED(mu_) override;

  // Channels held (one per receiver endpoint).
  int64_t channels() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Channel;
  struct InPlacePages;

  // Every page's regions and the sampled pages' checksums (kPageSums's
  // payload) of a source that names its regions; null when it does not (or
  // has no pages): staged.
  static absl::StatusOr<std::unique_ptr<InPlacePages>> ResolveInPlace(uint64_t transfer_id, const StateSource& source);
  // The channel of `ticket`'s endpoint, joined as rank 1 when the ticket
  // brings a new channel id (the previous channel is aborted).
  absl::StatusOr<std::shared_ptr<Channel>> ChannelFor(const Ticket& ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Remembers `channel_id` as failed or replaced, so that a late ticket
  // carrying it is refused rather than re-joined.
  void Retire(const std::string& channel_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `channel` (after a failure) and aborts it.
  void Drop(const std::string& endpoint, const std::shared_ptr<Channel>& channel) ABSL_LOCKS_EXCLUDED(mu_);
  // One transfer on a channel this thread holds. Errors of the channel come
  // back as `*channel_failed`.
  // `in_place`: the offer, null for staged.
  absl::Status Transfer(Communicator& comm, const Ticket& ticket, const StateSource& source,
                        const InPlacePages* in_place, bool* channel_failed);

  CommunicatorFactory& factory_;
  const ChannelSenderOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);  // by endpoint
  static constexpr size_t kMaxRetired = 64;
  std::deque<std::string> retired_ ABSL_GUARDED_BY(mu_);  // the latest kMaxRetired retired ids
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_CHANNEL_SENDER_H_
