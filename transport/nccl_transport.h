#ifndef HYBRIDSERVE_TRANSPORT_NCCL_TRANSPORT_H_
#define HYBRIDSERVE_TRANSPORT_NCCL_TRANSPORT_H_

// The NCCL data plane: StateSender / StateReceiver over a Communicator
// (transport/communicator.h), NCCL between GPUs (nccl_communicator.h), the
// in-memory fake in tests.
//
// Channels. The decode side (NcclStateReceiver) owns one channel per prefill
// peer. The first ticket for a peer creates it: a new unique id, joined as
// rank 0 and carried in Ticket::nccl_unique_id (prefill.proto's
// nccl_unique_id). The prefill side (NcclStateSender) keeps one channel per
// ticket endpoint, joins a new id as rank 1 and reuses it while tickets carry
// the same id. Transfers on a channel run one after another. A channel that
// fails (a peer gone, a stall, a message out of step) is aborted on the side
// that saw it, which the other side sees as its peer gone; the receiver
// fails every transfer expected on it and makes a new channel (a new id) for
// that peer's next ticket; the sender replaces its channel when a ticket
// brings a new id.
//
// Protocol. Every message is a frame of transport/frame.h sent as two
// channel messages: its 48-byte header, then its payload (payload_bytes
// announced in the header; not sent when 0), except the page regions of a
// transfer in place (below), which are bare messages. NCCL needs the size of
// every receive in advance: the headers are fixed-size, and each announces
// the next message(s). One transfer, S the sender (rank 1), R the receiver
// (rank 0):
//
//   S -> R  kBegin, payload BeginPayload (48 bytes): id, tokens, page format,
//           num_pages, page_bytes, state_bytes; followed, when S offers pages
//           in place, by a RegionOffer (frame.h: the n region sizes every
//           page splits into, in page byte order; 8 + 8n bytes). S offers
//           when its source names every page's regions
//           (StateSource::PageRegions) and has pages; it resolves them all,
//           and reads each sampled page (IsSampledPage) to the host to
//           checksum it, before this frame: a failure there sends nothing.
//   R -> S  kAck, the verdict (frame.h ack payload); its header's index is
//           the placement: 1 in place, 0 staged. R checks the header and
//           payload checksums, that the id is expected on this channel
//           (unknown, cancelled or late ids: NOT_FOUND, counted in
//           refused()), and the sizes against its ticket (INVALID_ARGUMENT),
//           all before it receives any page. With an offer: the regions must
//           sum to page_bytes, and when R holds a PageSink for the id
//           (ExpectFrom / ExpectTicketInPlace with a sink) its page count
//           and every page's region count and sizes must equal the offer's,
//           else INVALID_ARGUMENT ("region split" refused, counted); a match
//           is in place, no sink (or no offer) is staged. Anything but OK
//           ends the transfer here, the channel in step.
//   Staged (placement 0), as without an offer:
//   S -> R  kPage for pages 0, 1, ... (page_bytes each, from
//           StateSource::ReadPage through a host buffer, into a host
//           PageBlock), kState (the encoded state), kEnd (EndPayload, 8
//           bytes). Each header carries the XXH3-64 of its payload. In place
//           of any of these headers S may send a kAck carrying its own
//           failure (a page it could not read): R fails the transfer with it
//           and answers.
//   In place (placement 1):
//   S -> R  for page 0, 1, ...: its n regions as n bare messages of the
//           offered sizes, back to back, from the source's memory (the
//           prefill device pool) straight into the sink's regions (the
//           reserved slots of the decode pool): a request's pages are one
//           uninterrupted run of messages on the channel, no headers between
//           them and no host copy. Then kPageSums: the XXH3-64 of each
//           sampled page's bytes (u64 each, in page order; 8 x
//           SampledPages(num_pages) bytes, its own header checksum), then
//           kState and kEnd as staged (S may send its failure in place of
//           their headers). R returns ReceivedState with pages_in_place and
//           page_checksums; the pages are not yet verified: ImportReceived
//           (engine_import.h) marks them arrived, reads every sampled page
//           back from its slot and compares, and refuses the import with
//           DATA_LOSS on a mismatch, before the sequence goes live (the
//           reservation is aborted). Sampling rule (transfer.h): pages
//           0, 16, 32, ... and the last; a corrupted page between samples is
//           not detected. A transfer forgotten while its regions are
//           arriving (Cancel, the deadline) has its remaining regions
//           received into a host scratch buffer, never into the sink, and
//           its outcome is NOT_FOUND.
//   R -> S  kAck, the outcome: OK when the bytes are in the registry for
//           Await (staged) or in the slots (in place); DATA_LOSS when a
//           payload checksum failed (R still receives every announced
//           payload, into host buffers only, so the channel stays in step);
//           NOT_FOUND when the transfer was cancelled or passed its deadline
//           meanwhile (late bytes refused). A sampled page found corrupt at
//           import is DATA_LOSS on the receiver only: S has seen OK.
//
// Staged, nothing received is written into a reserved slot here: Await hands
// the verified bytes to ImportReceived. In place, R writes only into the
// sink of an expected, begun transfer, and holds the sink until Await or
// Cancel of that transfer returns (they wait for the region message in
// flight, at most io_timeout): the caller may then abort the reservation.
// Slots half-written by a failed transfer are harmless: the sequence never
// goes live and AbortImport returns them to the pool. A header that fails
// its checksum, a frame out of order, of another transfer or of another
// size puts the channel out of step: R fails that transfer and aborts the
// channel (a region message of another size does too).
//
// Deadlines. Each message mid-transfer must complete within `io_timeout`, so
// a peer that dies or stalls mid-transfer fails the transfer on both sides
// within about io_timeout (sooner where the channel reports the peer gone).
// The ticket's deadline is the registry's: Await returns DEADLINE_EXCEEDED at
// it, and the sender, past it, gets DEADLINE_EXCEEDED. An idle receiver
// channel waits for the next transfer without a deadline.
//
// Memory. Staged pages come from StateSource::ReadPage into a host buffer
// and land in host buffers (ReceivedState::pages); the NCCL communicator
// copies host messages through a device staging buffer. In place, the
// region messages carry the engine backend's device pointers (host memory
// on the CPU backend, which the fake communicator copies as well), sent and
// received by NCCL in place; only the sampled pages are copied to the host
// (SequenceTable::ExportPageInto on S, ImportedPageInto at import on R).
//
// Thread-safe, both classes.

#include <cstddef>
#include <cstdint>
#include <deque>
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

struct NcclReceiverOptions {
  // The longest wait for one message of a transfer in progress.
  absl::Duration io_timeout = absl::Seconds(10);
  // The longest wait for a peer to join a new channel. Not a ticket's
  // deadline: a channel outlives its first ticket.
  absl::Duration join_timeout = absl::Minutes(2);
  TransferRegistry::Limits limits;
  // The prefill peer of the tickets ExpectTicket completes: a decode worker
  // paired with one prefill worker (DESIGN.md: one communicator per
  // prefill/decode pair). Empty: ExpectTicket is FAILED_PRECONDITION, and
  // callers name the peer with ExpectFrom.
  std::string default_peer;
  // The kind put on tickets: kNccl, or kCudaIpc when the factory makes CUDA
  // IPC channels (transport/ipc_communicator.h), over which this same
  // protocol runs.
  TransportKind kind = TransportKind::kNccl;
};

class NcclStateReceiver final : public StateReceiver {
 public:
  // INVALID_ARGUMENT for a non-positive timeout. `factory` must outlive the
  // receiver.
  static absl::StatusOr<std::unique_ptr<NcclStateReceiver>> Create(CommunicatorFactory& factory,
                                                                   const NcclReceiverOptions& options);
  // Aborts every channel (the transfers expected on them fail UNAVAILABLE)
  // and joins its thread.
  ~NcclStateReceiver() override;

  // The unique id of the live channel to `peer` (a name for the prefill
  // worker, e.g. its address), made and joined as rank 0 the first time or
  // after the previous one failed. The peer must join within
  // options.join_timeout (it joins at its first Send), else the channel
  // fails. The factory's error when it cannot make one.
  absl::StatusOr<std::string> ChannelFor(absl::string_view peer) ABSL_LOCKS_EXCLUDED(mu_);

  // Sets ticket->nccl_unique_id to ChannelFor(peer) and expects the ticket.
  // With a `sink` (the ticket's reserved slots), pages offered in place land
  // there (see the protocol); the receiver holds it until Await or Cancel of
  // the transfer returns. INVALID_ARGUMENT for an id that already has a sink.
  absl::Status ExpectFrom(absl::string_view peer, Ticket* ticket, std::unique_ptr<PageSink> sink = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_);

  TransportKind kind() const override { return options_.kind; }
  // ExpectFrom(options.default_peer, ticket), with the kind set.
  absl::Status ExpectTicket(Ticket* ticket) ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_) override;
  absl::Status ExpectTicketInPlace(Ticket* ticket, std::unique_ptr<PageSink> sink)
      ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_) override;

  // As StateReceiver, and INVALID_ARGUMENT unless ticket.nccl_unique_id names
  // a live channel (ChannelFor): the transfer is accepted on that channel
  // only, and fails UNAVAILABLE when the channel does.
  absl::Status Expect(const Ticket& ticket) ABSL_LOCKS_EXCLUDED(mu_) override;
  absl::StatusOr<ReceivedState> Await(uint64_t transfer_id) ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_) override;
  void Cancel(uint64_t transfer_id) ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_) override;
  int64_t pending() const override { return registry_.pending(); }
  int64_t refused() const override { return registry_.refused(); }

  // Live channels (one per peer).
  int64_t channels() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Channel;

  NcclStateReceiver(CommunicatorFactory& factory, const NcclReceiverOptions& options);
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
  const NcclReceiverOptions options_;
  TransferRegistry registry_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Every channel whose thread has not been joined; failed ones leave
  // live_ at once and this list when their thread is joined.
  std::vector<std::unique_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Channel*> live_ ABSL_GUARDED_BY(mu_);      // peer -> its live channel
  absl::flat_hash_map<std::string, Channel*> by_id_ ABSL_GUARDED_BY(mu_);     // unique id -> live channel
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

struct NcclSenderOptions {
  // The longest wait for one message, the verdict or the final ack.
  absl::Duration io_timeout = absl::Seconds(10);
  // The longest wait for the receiver's end of a new channel (also bounded
  // by the ticket's deadline).
  absl::Duration join_timeout = absl::Seconds(30);
};

class NcclStateSender final : public StateSender {
 public:
  // `factory` must outlive the sender.
  explicit NcclStateSender(CommunicatorFactory& factory, const NcclSenderOptions& options = {})
      : factory_(factory), options_(options) {}
  ~NcclStateSender() override;

  // As StateSender; INVALID_ARGUMENT also for a ticket without an endpoint
  // or an NCCL unique id. Concurrent Sends to one receiver queue behind each
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
  // brings a new unique id (the previous channel is aborted).
  absl::StatusOr<std::shared_ptr<Channel>> ChannelFor(const Ticket& ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Remembers `unique_id` as failed or replaced, so that a late ticket
  // carrying it is refused rather than re-joined.
  void Retire(const std::string& unique_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `channel` (after a failure) and aborts it.
  void Drop(const std::string& endpoint, const std::shared_ptr<Channel>& channel) ABSL_LOCKS_EXCLUDED(mu_);
  // One transfer on a channel this thread holds. Errors of the channel come
  // back as `*channel_failed`.
  // `in_place`: the offer, null for staged.
  absl::Status Transfer(Communicator& comm, const Ticket& ticket, const StateSource& source,
                        const InPlacePages* in_place, bool* channel_failed);

  CommunicatorFactory& factory_;
  const NcclSenderOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);  // by endpoint
  static constexpr size_t kMaxRetired = 64;
  std::deque<std::string> retired_ ABSL_GUARDED_BY(mu_);  // the latest kMaxRetired retired ids
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_NCCL_TRANSPORT_H_
