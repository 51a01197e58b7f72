#ifndef HYBRIDSERVE_TRANSPORT_TRANSFER_H_
#define HYBRIDSERVE_TRANSPORT_TRANSFER_H_

// The data plane's contract (docs/ARCHITECTURE.md sections 3 and 6): moving the state of
// one sequence (its full KV pages in page order, the encoded state at the end
// of the prompt, the first sampled token) from a prefill worker into the
// slots a decode worker reserved for it.
//
// Decode reserves (SequenceTable::ReserveImport), describes the reservation
// as a Ticket (TicketFor, engine_import.h), and has the receiver expect it
// (ExpectReservation, engine_import.h) before it hands the ticket to prefill;
// prefill sends with a StateSender; decode's Await returns the bytes,
// verified against the ticket, and ImportReceived (transport/engine_import.h)
// writes them into the reservation. Bytes for a transfer id that is not
// expected (unknown, finished, cancelled or past its deadline) are refused,
// and so are those of a sender that does not present the ticket's secret
// (Ticket::secret): proof that decode handed it the ticket.
//
// Pages in place. A source that can name a page's bytes in memory the
// channel reads directly (StateSource::PageRegions: the engine's device pool)
// and a receiver given a PageSink for the transfer (the reserved slots) let a
// channel plane move the pages without a host copy: they land in the
// slots, ReceivedState says so, and ImportReceived only records their
// arrival. The channel cannot checksum bytes it never sees on the host, so
// sampled pages (IsSampledPage) are checksummed by the sender from a host
// copy and read back and compared by ImportReceived before the sequence goes
// live. Transports without it (TCP, in-process) stage every page through
// host memory and ignore both; so do the channel planes when either side
// lacks them.
//
// Held pages. A receiver that already holds the first pages of the prompt
// in its reserved slots (decode read them from the cachestore by shared
// memory, SequenceTable::ImportPageHostViews) says so in the ticket
// (Ticket::held_pages). The sender may keep fewer of them (a prefill worker
// keeps only those it restored from the same cache entries, so the bytes
// are its own): it sends from a page at most held_pages on, names that page
// (ReceivedState::first_page), and the import keeps the receiver's pages
// before it and overwrites the rest (ImportReceived). TCP and in-process
// take held pages; the channel planes send every page and refuse a ticket
// with held pages.
//
// Implementations: in-process (tests, two engines in one process;
// in_process_transport.h), TCP (the CPU default; tcp_transport.h), and the
// channel planes, one protocol (channel_protocol.h) over a two-rank message
// channel: NCCL between GPUs and CUDA IPC between two processes on one GPU
// (channel_sender.h, channel_receiver.h). A prefill worker that serves
// several routes each ticket by its kind (transport/routing_sender.h).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "transport/page_block.h"
#include "transport/transfer_secret.h"

namespace hybridserve::transport {

// Which data plane a ticket travels on (prefill.proto's TransportKind).
enum class TransportKind : int {
  kInProcess = 1,  // two engines in one process
  kTcp = 2,        // the CPU default
  kNccl = 3,       // GPUs: the channel protocol over NCCL send/recv (nccl_communicator.h)
  kCudaIpc = 4,    // two processes on one GPU: the channel protocol over CUDA IPC (ipc_communicator.h)
};
inline const char* TransportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kInProcess:
      return "in_process";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kNccl:
      return "nccl";
    case TransportKind::kCudaIpc:
      return "cuda_ipc";
  }
  return "unknown";
}
// Whether tickets of this plane may carry held pages ("Held pages" above):
// TCP and in-process take them; the channel planes send every page.
inline bool PlaneTakesHeldPages(TransportKind kind) {
  return kind == TransportKind::kTcp || kind == TransportKind::kInProcess;
}

// sizeof(ncclUniqueId): the length of Ticket::channel_id on NCCL tickets.
inline constexpr size_t kNcclUniqueIdBytes = 128;

// The domain form of prefill.proto's TransferTicket: what decode reserved and
// where prefill must send. Value type.
struct Ticket {
  // Set by the receiver that expects the ticket (StateReceiver::ExpectTicket,
  // ExpectReservation); a sender routes on it (RoutingStateSender).
  TransportKind kind = TransportKind::kTcp;
  uint64_t transfer_id = 0;  // unique per receiver
  // TCP: "host:port" of the receiver's listener. NCCL, CUDA IPC: names the
  // receiver (the sender keeps one channel per endpoint). In-process: unused.
  std::string endpoint;
  int64_t n_tokens = 0;  // the position of the state to send (the prompt length)
  // The receiver's page format (engine/page_format.h PageFormatFingerprint)
  // and sizes: a sender with another layout refuses before sending a byte.
  common::Hash128 page_format;
  int64_t num_pages = 0;        // full pages: n_tokens / page_size (0 without attention layers)
  int64_t page_bytes = 0;       // bytes of each page
  int64_t max_state_bytes = 0;  // upper bound of the encoded state
  // Pages [0, held_pages) of the num_pages are already in the receiver's
  // slots ("Held pages" above): a sender given this ticket sends pages
  // [held_pages, num_pages) (lower it to send more). 0 <= held_pages <=
  // num_pages; 0 on the channel planes.
  int64_t held_pages = 0;
  // Physical slots reserved on the receiver (pages in place land there).
  std::vector<int32_t> page_slots;
  int32_t state_slot = -1;
  absl::Time deadline = absl::InfiniteFuture();  // the receiver forgets the transfer after it
  // The id of the receiver's channel to the sending peer
  // (CommunicatorFactory::NewUniqueId), set by the receiver. NCCL: the
  // ncclUniqueId (kNcclUniqueIdBytes), prefill.proto's nccl_unique_id. CUDA
  // IPC: the IpcCommunicatorFactory channel's "host:port/token",
  // prefill.proto's cuda_ipc_channel. The sender joins it as rank 1 the
  // first time it sees it and reuses it for later tickets carrying the same
  // id. Empty for TCP and in-process.
  std::string channel_id;
  // The per-transfer secret (kTransferSecretBytes random bytes,
  // NewTransferSecret), set by the receiver that expects the ticket
  // (ExpectTicket, ExpectReservation). The sender presents it in its kBegin
  // (frame.h); the receiver accepts a transfer only from a sender that
  // presents its ticket's secret: proof that decode gave that sender the
  // ticket (through the Prefill call). prefill.proto's transfer_secret.
  std::string secret;
};

// A contiguous run of memory a channel reads or writes directly: device
// memory of the engine's backend (host memory on the CPU backend).
struct MemoryRegion {
  void* data = nullptr;
  size_t bytes = 0;
};

// The sampling rule of in-place pages: page `index` of `num_pages` is
// checksummed end to end when index % kPageSampleInterval == 0 or it is the
// last page. Both sides apply it; SampledPages counts them.
inline constexpr int64_t kPageSampleInterval = 16;
inline bool IsSampledPage(int64_t index, int64_t num_pages) {
  return index % kPageSampleInterval == 0 || index == num_pages - 1;
}
inline int64_t SampledPages(int64_t num_pages) {
  if (num_pages <= 0) return 0;
  const int64_t on_grid = (num_pages - 1) / kPageSampleInterval + 1;
  return on_grid + ((num_pages - 1) % kPageSampleInterval != 0 ? 1 : 0);
}

// The sender's checksum of one sampled page (XXH3-64 of its page bytes).
struct PageChecksum {
  int64_t page = 0;
  uint64_t checksum = 0;
};

// What a sender reads: the sequence's pages and state on the prefill side.
// Implementations need not be thread-safe; a sender reads from the calling
// thread only.
class StateSource {
 public:
  virtual ~StateSource() = default;
  virtual int64_t num_pages() const = 0;
  virtual int64_t page_bytes() const = 0;
  // Writes page `index` (< num_pages()) into `out` (page_bytes() bytes).
  virtual absl::Status ReadPage(int64_t index, absl::Span<char> out) const = 0;
  // Optional, for pages in place: page `index` as regions a device channel
  // reads directly, in page byte order (their bytes back to back are what
  // ReadPage writes), valid while the source is used. UNIMPLEMENTED (the
  // default): pages travel staged through ReadPage.
  virtual absl::StatusOr<std::vector<MemoryRegion>> PageRegions(int64_t index) const {
    return absl::UnimplementedError("this state source has no page regions: pages are staged");
  }
  // Optional, for a sender that writes from host memory (TCP): page `index`
  // as host bytes it may read directly, in page byte order (back to back,
  // what ReadPage writes), valid while the source is used. UNIMPLEMENTED
  // (the default, or memory the host cannot address): staged through ReadPage.
  virtual absl::StatusOr<std::vector<absl::string_view>> PageHostViews(int64_t index) const {
    return absl::UnimplementedError("this state source has no host views of its pages: pages are staged");
  }
  // The encoded state (engine/snapshot_codec.h) at the ticket's position.
  virtual absl::string_view state() const = 0;
  virtual int32_t first_token() const = 0;
  virtual float first_logprob() const = 0;
};

// Where the pages of one transfer land when they travel in place: the
// receiver's reserved page slots. Made on the thread that owns them (the
// engine's) with every region resolved, then read from the receiver's own
// thread: implementations are immutable after construction, so thread-safe.
// The receiver writes into the regions only while it holds the sink (until
// Await or Cancel of its transfer returns).
class PageSink {
 public:
  virtual ~PageSink() = default;
  virtual int64_t num_pages() const = 0;
  // Page `index` (< num_pages()), in page byte order.
  virtual const std::vector<MemoryRegion>& PageRegions(int64_t index) const = 0;
};

// Makes the PageSink of one ticket's reserved page slots on demand
// (ReservationPageSink, engine_import.h), or fails with why it cannot.
// Resolving the slots' regions costs the engine a backend synchronization,
// so a receiver that takes no pages in place never calls it.
using PageSinkFactory = absl::FunctionRef<absl::StatusOr<std::unique_ptr<PageSink>>()>;

// What a receiver hands back for a completed transfer, verified against its
// ticket (sizes, checksums on the wire). Move-only value type.
struct ReceivedState {
  uint64_t transfer_id = 0;
  // The first page the sender sent (its ticket's held_pages): pages before
  // it are the receiver's own ("Held pages" above).
  int64_t first_page = 0;
  // Staged: pages [first_page, num_pages) of page_bytes each, in page
  // order. In place: empty, the pages are already in the PageSink's regions.
  PageBlock pages;
  // In place: every page's bytes arrived in the sink's regions (not yet
  // verified), and page_checksums holds the sender's checksum of each
  // sampled page (IsSampledPage), in page order, for the read-back check.
  bool pages_in_place = false;
  int64_t num_pages_in_place = 0;
  std::vector<PageChecksum> page_checksums;
  std::string state;  // the encoded state
  int32_t first_token = 0;
  float first_logprob = 0.0f;
};

// Prefill's side. Thread-safe: concurrent Sends to different tickets.
class StateSender {
 public:
  virtual ~StateSender() = default;
  // Sends everything `source` holds to the ticket's receiver but the pages
  // it holds (Ticket::held_pages), presenting the ticket's secret, and waits
  // for it to acknowledge. INVALID_ARGUMENT when the source does not match
  // the ticket (sizes, held pages beyond its pages or on a plane that sends
  // every page) or the ticket has no kTransferSecretBytes secret; the receiver's refusal as its status
  // (UNAUTHENTICATED for a transfer id it does not expect, never or no longer,
  // or another secret; NOT_FOUND for a transfer that finished or was forgotten
  // while it arrived; ALREADY_EXISTS when another sender began it;
  // INVALID_ARGUMENT for a mismatch, DATA_LOSS for a checksum); UNAVAILABLE
  // when the receiver cannot be reached or goes away, and from TCP, whose
  // receiver drops without a word a sender it does not expect (the
  // UNAUTHENTICATED cases); DEADLINE_EXCEEDED past the ticket's deadline.
  virtual absl::Status Send(const Ticket& ticket, const StateSource& source) = 0;
};

// Decode's side. Thread-safe.
class StateReceiver {
 public:
  virtual ~StateReceiver() = default;
  // The data plane this receiver serves.
  virtual TransportKind kind() const = 0;
  // Completes `ticket` with what this receiver's transport needs (its kind,
  // a new secret; the channel planes: the id of the channel to the prefill
  // peer) and expects it, its pages staged. INTERNAL when no secret can be
  // drawn (RandomSecret).
  virtual absl::Status ExpectTicket(Ticket* ticket) {
    ticket->kind = kind();
    absl::StatusOr<std::string> secret = NewTransferSecret();
    if (!secret.ok()) return secret.status();
    ticket->secret = *std::move(secret);
    return Expect(*ticket);
  }
  // What a decode worker calls (through ExpectReservation, engine_import.h)
  // before it hands the ticket of a reservation to prefill: ExpectTicket,
  // and where the plane moves pages in place (NCCL, CUDA IPC), the sink
  // `reserved_slots` makes (the ticket's page slots) offered for them, held
  // until Await or Cancel of the transfer returns; its error is returned
  // before anything is expected. The default (TCP, in-process): ExpectTicket,
  // pages staged, `reserved_slots` not called. ReceivedState::pages_in_place
  // says which happened. Call from the thread `reserved_slots` may run on.
  virtual absl::Status ExpectReservation(Ticket* ticket, PageSinkFactory reserved_slots) {
    return ExpectTicket(ticket);
  }
  // Registers a transfer to accept. INVALID_ARGUMENT for a ticket id already
  // expected, or sizes out of range.
  virtual absl::Status Expect(const Ticket& ticket) = 0;
  // Blocks until the transfer completes (its bytes) or fails, and until
  // nothing more will be written into its PageSink: the sender's
  // failure as UNAVAILABLE (a peer that went away or stalled), DEADLINE_EXCEEDED
  // at the ticket's deadline, CANCELLED after Cancel, NOT_FOUND for an id not
  // expected. Either way the transfer is forgotten: late bytes are refused.
  virtual absl::StatusOr<ReceivedState> Await(uint64_t transfer_id) = 0;
  // Forgets a transfer: a pending Await returns CANCELLED, bytes still on the
  // way are refused (and kept out of its PageSink: Cancel returns once
  // nothing more will be written there). No-op for an unknown id.
  virtual void Cancel(uint64_t transfer_id) = 0;
  // Transfers expected and not yet awaited to the end (for metrics and tests).
  virtual int64_t pending() const = 0;
  // Transfers whose bytes were refused from a sender that presented the
  // ticket's secret (already begun or finished, mismatch, corruption,
  // forgotten while arriving; TCP: also connections beyond max_connections).
  // TransferRegistry counts them.
  virtual int64_t refused() const = 0;
  // Senders dropped or refused before they proved a ticket: a transfer id not
  // expected (never, or no longer: a late sender counts here), another
  // secret, and on TCP a connection without an intact begin frame. Nothing
  // expected was touched. Disjoint from refused().
  virtual int64_t unauthenticated() const = 0;
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_TRANSFER_H_
