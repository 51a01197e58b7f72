#ifndef HYBRIDSERVE_TRANSPORT_ENGINE_IMPORT_H_
#define HYBRIDSERVE_TRANSPORT_ENGINE_IMPORT_H_

// The bridge between the data plane and the engine's sequence table: the
// ticket of an import reservation (decode side), the source of a sequence's
// state (prefill side, with its pages' device regions for pages in place),
// the sink of a reservation's page slots and the receiver's expectation of
// them (decode side, pages in place), and the import of received bytes into
// the reservation.
//
// Not thread-safe: the sequence table is not; call from the thread that owns
// the engine. A ReservationPageSink, once made, is immutable (PageSink).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/sequence_table.h"
#include "transport/transfer.h"

namespace hybridserve::transport {

// The ticket describing `reservation` of `table`.
absl::StatusOr<Ticket> TicketFor(const engine::SequenceTable& table, const engine::ImportReservation& reservation,
                                 uint64_t transfer_id, absl::string_view endpoint, absl::Time deadline);

// OK when `table`'s pages can be sent on `ticket` (same page format, same
// sizes); INVALID_ARGUMENT saying what differs otherwise.
absl::Status CheckTicket(const engine::SequenceTable& table, const Ticket& ticket);

// The state of a live sequence at the ticket's position, for a sender: pages
// read from the pools on demand, the state encoded once at construction.
class SequenceStateSource final : public StateSource {
 public:
  // INVALID_ARGUMENT when the sequence is not at the ticket's position or the
  // ticket does not fit the table (CheckTicket); NOT_FOUND / FAILED_PRECONDITION
  // as SequenceTable. `table` must outlive the source and the sequence must
  // not change while it is used.
  static absl::StatusOr<SequenceStateSource> Create(const engine::SequenceTable& table, engine::SequenceId id,
                                                    const Ticket& ticket, const common::Hash128& model_fingerprint,
                                                    const common::Hash128& prefix_hash, int32_t first_token,
                                                    float first_logprob);

  int64_t num_pages() const override { return num_pages_; }
  int64_t page_bytes() const override { return table_->layout().page_bytes(); }
  absl::Status ReadPage(int64_t index, absl::Span<char> out) const override {
    return table_->ExportPageInto(id_, index, out);
  }
  // The page's regions in the prefill pool (SequenceTable::ExportPageRegions).
  absl::StatusOr<std::vector<MemoryRegion>> PageRegions(int64_t index) const override;
  // The page's K and V of each layer in the prefill pool
  // (SequenceTable::PageViews); UNIMPLEMENTED on a backend the host cannot address.
  absl::StatusOr<std::vector<absl::string_view>> PageHostViews(int64_t index) const override;
  absl::string_view state() const override { return state_; }
  int32_t first_token() const override { return first_token_; }
  float first_logprob() const override { return first_logprob_; }

 private:
  SequenceStateSource() = default;

  const engine::SequenceTable* table_ = nullptr;
  engine::SequenceId id_ = 0;
  int64_t num_pages_ = 0;
  std::string state_;
  int32_t first_token_ = 0;
  float first_logprob_ = 0.0f;
};

// The page slots of `reservation` (SequenceTable::ImportPageRegions of each
// full page), for a receiver that takes pages in place
// (StateReceiver::ExpectReservation). Errors of ImportPageRegions. The
// sink must be handed back (its transfer awaited or cancelled) before the
// reservation is finished, aborted or released.
class ReservationPageSink final : public PageSink {
 public:
  static absl::StatusOr<std::unique_ptr<ReservationPageSink>> Create(const engine::SequenceTable& table,
                                                                     const engine::ImportReservation& reservation);
  int64_t num_pages() const override { return static_cast<int64_t>(pages_.size()); }
  const std::vector<MemoryRegion>& PageRegions(int64_t index) const override {
    return pages_[static_cast<size_t>(index)];
  }

 private:
  ReservationPageSink() = default;
  std::vector<std::vector<MemoryRegion>> pages_;
};

// receiver.ExpectReservation(ticket, ...) with the slots of `reservation`
// (whose ticket, TicketFor, `ticket` is) as the sink, made
// (ReservationPageSink::Create) only when the receiver's plane takes pages
// in place. A decode worker calls it before it hands the ticket to prefill.
// Errors of the receiver and of ReservationPageSink::Create.
absl::Status ExpectReservation(StateReceiver& receiver, Ticket* ticket, const engine::SequenceTable& table,
                               const engine::ImportReservation& reservation);

// Writes `received` into the importing sequence of `reservation` and makes it
// live: every page, then the state, checked against the table's layout and
// the reserved position before any slot is touched by it. `held_pages`:
// the first pages the receiver wrote into the reservation itself
// (SequenceTable::ImportPageHostViews; transfer.h "Held pages"). Those
// before received.first_page are kept (marked arrived), the sender's
// pages overwrite the others; a transfer that skipped a page the receiver
// does not hold (first_page > held_pages) is INVALID_ARGUMENT. Pages that came in
// place (received.pages_in_place: already in the reservation's slots, made
// by ReservationPageSink) are marked arrived, and each sampled page
// (IsSampledPage) is read back and its XXH3-64 compared with the sender's,
// all before FinishImport makes the sequence live. On any error the import
// is aborted (every reserved page and the slot are freed) and the error
// returned: INVALID_ARGUMENT for counts or sizes that do not match, DATA_LOSS
// for a corrupted state or a sampled page that landed with other bytes,
// FAILED_PRECONDITION for a state of another model layout or position.
absl::Status ImportReceived(engine::SequenceTable& table, const engine::ImportReservation& reservation,
                            const ReceivedState& received, int64_t held_pages = 0);

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_ENGINE_IMPORT_H_
