#ifndef HYBRIDSERVE_TRANSPORT_CHANNEL_PROTOCOL_H_
#define HYBRIDSERVE_TRANSPORT_CHANNEL_PROTOCOL_H_

// The channel data plane's protocol, shared by both ends: a StateSender
// (ChannelStateSender, channel_sender.h) and a StateReceiver
// (ChannelStateReceiver, channel_receiver.h) over a two-rank message channel
// (transport/communicator.h): NCCL between GPUs (TransportKind::kNccl,
// nccl_communicator.h), CUDA IPC between two processes on one GPU
// (kCudaIpc, ipc_communicator.h), the in-memory fake in tests
// (fake_communicator.h). The protocol is the same over every channel.
//
// Channels. The decode side (the receiver) owns one channel per prefill
// peer. The first ticket for a peer creates it: a new channel id
// (CommunicatorFactory::NewUniqueId), joined as rank 0 and carried in
// Ticket::channel_id. The prefill side (the sender) keeps one channel per
// ticket endpoint, joins a new id as rank 1 and reuses it while tickets carry
// the same id. Transfers on a channel run one after another. A channel that
// fails (a peer gone, a stall, a message out of step) is aborted on the side
// that saw it, which the other side sees as its peer gone; the receiver
// fails every transfer expected on it and makes a new channel (a new id) for
// that peer's next ticket; the sender replaces its channel when a ticket
// brings a new id.
//
// Who may send. Two proofs, both handed out by decode inside tickets, which
// reach prefill only through the (authenticated) Prefill call. Joining a
// channel takes its id: NCCL's unique id carries a random 64-bit magic that
// NCCL's bootstrap checks on every connection (nccl_communicator.h); the CUDA
// IPC id carries a random 128-bit token its control connection checks before
// anything else (ipc_communicator.h). Beginning a transfer takes its ticket's
// per-transfer secret in the kBegin (below). A begin without it is refused
// (UNAUTHENTICATED) but answered: the peer has proved the channel, and the
// answer keeps the channel in step.
//
// Messages. Every message is a frame of transport/frame.h sent as two
// channel messages: its 48-byte header, then its payload (payload_bytes
// announced in the header; not sent when 0), except the page regions of a
// transfer in place (below), which are bare messages. The channel needs the
// size of every receive in advance (NCCL's contract): the headers are
// fixed-size, and each announces the next message(s). One transfer, S the
// sender (rank 1), R the receiver (rank 0):
//
//   S -> R  kBegin, payload BeginPayload (64 bytes): id, tokens, page format,
//           num_pages, page_bytes, state_bytes, the ticket's secret
//           (Ticket::secret); followed, when S offers pages
//           in place, by a RegionOffer (frame.h: the n region sizes every
//           page splits into, in page byte order; 8 + 8n bytes). S offers
//           when its source names every page's regions
//           (StateSource::PageRegions) and has pages; it resolves them all,
//           and reads each sampled page (IsSampledPage) to the host to
//           checksum it, before this frame: a failure there sends nothing.
//   R -> S  kAck, the verdict (frame.h ack payload); its header's index is
//           the placement (kPlacementInPlace or kPlacementStaged). R checks
//           the header and payload checksums, that the id is not expected on
//           another channel (NOT_FOUND, counted in refused()), that it is
//           expected and the begin presents its ticket's secret, compared in
//           constant time before the transfer is claimed (unknown, cancelled
//           or late ids, another secret: UNAUTHENTICATED, counted in
//           unauthenticated(), the transfer untouched), and the sizes against
//           its ticket (INVALID_ARGUMENT), all before it receives any page. With an offer: the regions must
//           sum to page_bytes, and when R holds a PageSink for the id
//           (ExpectFrom with a sink, ExpectReservation) its page count
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
// A header that fails its checksum, a frame out of order, of another
// transfer or of another size puts the channel out of step: R fails that
// transfer and aborts the channel (a region message of another size does
// too).
//
// Deadlines. Each message mid-transfer must complete within the side's
// `io_timeout`, so a peer that dies or stalls mid-transfer fails the
// transfer on both sides within about io_timeout (sooner where the channel
// reports the peer gone). The ticket's deadline is the registry's: Await
// returns DEADLINE_EXCEEDED at it, and the sender, past it, gets
// DEADLINE_EXCEEDED. An idle receiver channel waits for the next transfer
// without a deadline.
//
// Memory. Staged pages come from StateSource::ReadPage into a host buffer
// and land in host buffers (ReceivedState::pages); the channel carries host
// messages as it can (NCCL through a device staging buffer, CUDA IPC over
// its host connection). In place, the region messages carry the engine
// backend's device pointers (host memory on the CPU backend, which the fake
// communicator copies as well), moved device to device by the channel; only
// the sampled pages are copied to the host (SequenceTable::ExportPageInto on
// S, ImportedPageInto at import on R).
//
// The functions below are one side's steps of that conversation: each uses
// the channel from the calling thread only (Communicator's contract), and
// their errors are the channel's (it is out of step or gone). Thread-safe
// otherwise (no shared state).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "transport/communicator.h"
#include "transport/frame.h"

namespace hybridserve::transport {

// The placement a verdict's header index announces.
inline constexpr uint64_t kPlacementStaged = 0;
inline constexpr uint64_t kPlacementInPlace = 1;

// Sends frame (type, transfer_id, index) and its payload: the header, then
// the payload as a second message unless it is empty.
absl::Status SendFrame(Communicator& comm, FrameType type, uint64_t transfer_id, uint64_t index,
                       absl::string_view payload, absl::Time deadline);

// Receives the ack of `transfer_id`: what it carries into `*carried`, its
// header's index (the placement of a verdict) into `*index` when set.
absl::Status RecvAck(Communicator& comm, uint64_t transfer_id, absl::Time deadline, absl::Status* carried,
                     uint64_t* index = nullptr);

// Receives frame (type, transfer_id, index) with `payload_bytes` of payload
// into `*payload`: true when it arrived (a payload that fails its checksum
// sets `*outcome` to DATA_LOSS if still OK), false when the sender sent its
// own failure in its place (UNAVAILABLE in `*outcome` if still OK).
absl::StatusOr<bool> RecvFrame(Communicator& comm, absl::Time deadline, FrameType type, uint64_t transfer_id,
                               uint64_t index, uint64_t payload_bytes, std::string* payload, absl::Status* outcome);

// "a,b,c": the region sizes of a page split, for error messages.
std::string RegionSplitText(const std::vector<int64_t>& split);

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_CHANNEL_PROTOCOL_H_
