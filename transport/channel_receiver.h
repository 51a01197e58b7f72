#ifndef HYBRIDSERVE_TRANSPORT_CHANNEL_RECEIVER_H_
#define HYBRIDSERVE_TRANSPORT_CHANNEL_RECEIVER_H_

// The decode side of the channel data plane (NCCL or CUDA IPC; the protocol,
// channels and deadlines are in transport/channel_protocol.h): a
// StateReceiver that owns one channel per prefill peer, each served by its
// own thread, one transfer after another.
//
// Staged, nothing received is written into a reserved slot here: Await hands
// the verified bytes to ImportReceived. In place, the receiver writes only
// into the sink of an expected, begun transfer, and holds the sink until
// Await or Cancel of that transfer returns (they wait for the region message
// in flight, at most io_timeout): the caller may then abort the reservation.
// Slots half-written by a failed transfer are harmless: the sequence never
// goes live and AbortImport returns them to the pool.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/communicator.h"
#include "transport/frame.h"
#include "transport/transfer.h"
#include "transport/transfer_registry.h"

namespace hybridserve::transport {

struct ChannelReceiverOptions {
  // The longest wait for one message of a transfer in progress.
  absl::Duration io_timeout = absl::Seconds(10);
  // The longest wait for a peer to join a new channel. Not a ticket's
  // deadline: a channel outlives its first ticket.
  absl::Duration join_timeout = absl::Minutes(2);
  TransferRegistry::Limits limits;
  // The prefill peer of the tickets ExpectTicket and ExpectReservation
  // complete: a decode worker paired with one prefill worker (docs/ARCHITECTURE.md: one
  // communicator per prefill/decode pair). Empty: both are
  // FAILED_PRECONDITION, and callers name the peer with ExpectFrom.
  std::string default_peer;
  // The kind put on tickets: kNccl when the factory makes NCCL channels
  // (nccl_communicator.h), kCudaIpc when it makes CUDA IPC channels
  // (ipc_communicator.h). The protocol is the same.
  TransportKind kind = TransportKind::kNccl;
};

// Thread-safe.
class ChannelStateReceiver final : public StateReceiver {
 public:
  // INVALID_ARGUMENT for a non-positive timeout. `factory` must outlive the
  // receiver.
  static absl::StatusOr<std::unique_ptr<ChannelStateReceiver>> Create(CommunicatorFactory& factory,
                                                                      const ChannelReceiverOptions& options);
  // Aborts every channel (the transfers expected on them fail UNAVAILABLE)
  // and joins its thread.
  ~ChannelStateReceiver() override;

  // The id of the live channel to `peer` (a name for the prefill
  // worker, e.g. its address), made and joined as rank 0 the first time or
  // after the previous one failed. The peer must join within
  // options.join_timeout (it joins at its first Send), else the channel
  // fails. The factory's error when it cannot make one.
  absl::StatusOr<std::string> ChannelFor(absl::string_view peer) ABSL_LOCKS_EXCLUDED(mu_);

  // Sets the ticket's kind, a new secret (NewTransferSecret) and its
  // channel_id to ChannelFor(peer), and expects it. With a `sink` (the ticket's reserved slots), pages offered in
  // place land there (channel_protocol.h); the receiver holds it until Await
  // or Cancel of the transfer returns. INVALID_ARGUMENT for an id that
  // already has a sink.
  absl::Status ExpectFrom(absl::string_view peer, Ticket* ticket, std::unique_ptr<PageSink> sink = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_);

  TransportKind kind() const override { return options_.kind; }
  // ExpectFrom(options.default_peer, ticket): staged.
  absl::Status ExpectTicket(Ticket* ticket) ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_) override;
  // ExpectFrom(options.default_peer, ticket) with the sink `reserved_slots`
  // makes: pages offered in place land there. Its error, before anything is
  // expected.
  absl::Status ExpectReservation(Ticket* ticket, PageSinkFactory reserved_slots)
      ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_) override;

  // As StateReceiver, and INVALID_ARGUMENT unless ticket.channel_id names
  // a live channel (ChannelFor): the transfer is accepted on that channel
  // only, and fails UNAVAILABLE when the channel does.
  absl::Status Expect(const Ticket& ticket) ABSL_LOCKS_EXCLUDED(mu_) override;
  absl::StatusOr<ReceivedState> Await(uint64_t transfer_id) ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_) override;
  void Cancel(uint64_t transfer_id) ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_) override;
  int64_t pending() const override { return registry_.pending(); }
  int64_t refused() const override { return registry_.refused(); }
  int64_t unauthenticated() const override { return registry_.unauthenticated(); }
  // Await calls blocked waiting for their transfer (tests).
  int64_t awaiting() const { return registry_.awaiting(); }

  // Live channels (one per peer).
  int64_t channels() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Channel;

  ChannelStateReceiver(CommunicatorFactory& factory, const ChannelReceiverOptions& options);
  // ExpectFrom(options.default_peer, ticket, sink); FAILED_PRECONDITION
  // without a default peer.
  absl::Status ExpectFromDefaultPeer(Ticket* ticket, std::unique_ptr<PageSink> sink)
      ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_);
  // The channel's thread: the join, then one transfer after another until
  // the channel fails or the receiver stops.
  void Serve(Channel* channel) ABSL_LOCKS_EXCLUDED(mu_);
  // Serves the transfer whose kBegin header is `raw`. Errors are the
  // channel's (it is out of step); a transfer's own outcome goes to the
  // registry and its ack.
  absl::Status ServeTransfer(Channel& channel, absl::string_view raw) ABSL_LOCKS_EXCLUDED(mu_);
  // Receives the frames after an accepted kBegin into `received`. Errors are
  // the channel's; `*outcome` is what the transfer's ack will carry.
  // `split`: the region sizes of a transfer in place, null for staged.
  absl::Status ReceiveBody(Communicator& comm, const BeginPayload& begin, const std::vector<int64_t>* split,
                           ReceivedState* received, absl::Status* outcome) ABSL_LOCKS_EXCLUDED(sinks_mu_);
  // The pages in place and kPageSums, into the transfer's sink.
  absl::Status ReceivePagesInPlace(Communicator& comm, const BeginPayload& begin, const std::vector<int64_t>& split,
                                   ReceivedState* received, absl::Status* outcome) ABSL_LOCKS_EXCLUDED(sinks_mu_);
  // The placement of an offer `split`: `*in_place` when the transfer's sink
  // matches it, staged without a sink; INVALID_ARGUMENT for a mismatch.
  absl::Status Placement(uint64_t transfer_id, const BeginPayload& begin, const std::vector<int64_t>& split,
                         bool* in_place) ABSL_LOCKS_EXCLUDED(sinks_mu_);
  // Region `region` of page `page` of the transfer's sink, marked being
  // written until EndSinkWrite; null when the sink was revoked (or is gone).
  void* BeginSinkWrite(uint64_t transfer_id, int64_t page, size_t region) ABSL_LOCKS_EXCLUDED(sinks_mu_);
  void EndSinkWrite(uint64_t transfer_id) ABSL_LOCKS_EXCLUDED(sinks_mu_);
  // Stops every later write into the transfer's sink, waits for the one in
  // flight, and destroys the sink. No-op without a sink.
  void RevokeSink(uint64_t transfer_id) ABSL_LOCKS_EXCLUDED(sinks_mu_);
  // Marks `channel` failed, aborts it and fails every transfer expected on
  // it; `serving`, the transfer whose frames the channel's thread was
  // receiving, with `why` itself. The channel is no longer live when the
  // first failure is published: whoever sees a transfer fail and expects
  // again is given a new channel, never the failing one.
  void Fail(Channel* channel, const absl::Status& why, std::optional<uint64_t> serving = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // True when `transfer_id` is expected on a channel other than `channel`.
  bool ExpectedElsewhere(uint64_t transfer_id, const Channel* channel) const ABSL_LOCKS_EXCLUDED(mu_);
  void Unbind(uint64_t transfer_id) ABSL_LOCKS_EXCLUDED(mu_);
  void JoinFinished() ABSL_LOCKS_EXCLUDED(mu_);

  CommunicatorFactory& factory_;
  const ChannelReceiverOptions options_;
  TransferRegistry registry_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Every channel whose thread has not been joined; failed ones leave
  // live_ at once and this list when their thread is joined.
  std::vector<std::unique_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Channel*> live_ ABSL_GUARDED_BY(mu_);      // peer -> its live channel
  absl::flat_hash_map<std::string, Channel*> by_id_ ABSL_GUARDED_BY(mu_);     // channel id -> live channel
  absl::flat_hash_map<uint64_t, Channel*> expected_on_ ABSL_GUARDED_BY(mu_);  // transfer id -> its channel

  // The page sinks of transfers expected in place.
  struct SinkHold {
    std::unique_ptr<PageSink> sink;
    bool writing = false;  // a region message is being received into it
    bool revoked = false;  // Await or Cancel began: no more writes
  };
  absl::Mutex sinks_mu_;
  absl::flat_hash_map<uint64_t, SinkHold> sinks_ ABSL_GUARDED_BY(sinks_mu_);  // by transfer id
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_CHANNEL_RECEIVER_H_
