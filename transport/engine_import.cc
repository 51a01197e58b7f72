#include "transport/engine_import.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "engine/page_format.h"
#include "engine/snapshot_codec.h"

namespace hybridserve::transport {

absl::StatusOr<Ticket> TicketFor(const engine::SequenceTable& table, const engine::ImportReservation& reservation,
                                 uint64_t transfer_id, absl::string_view endpoint, absl::Time deadline) {
  const engine::StateLayout& layout = table.layout();
  Ticket t;
  t.transfer_id = transfer_id;
  t.endpoint = std::string(endpoint);
  t.n_tokens = reservation.n_tokens;
  t.page_format = reservation.page_format;
  t.num_pages = layout.attention_layers > 0 ? layout.full_pages(reservation.n_tokens) : 0;
  t.page_bytes = layout.page_bytes();
  ASSIGN_OR_RETURN(const size_t state_bytes,
                   engine::EncodedSnapshotSize(layout, reservation.n_tokens, /*with_logits=*/true));
  t.max_state_bytes = static_cast<int64_t>(state_bytes);
  t.page_slots = reservation.page_slots;
  t.state_slot = reservation.state_slot;
  t.deadline = deadline;
  return t;
}

absl::Status CheckTicket(const engine::SequenceTable& table, const Ticket& ticket) {
  const engine::StateLayout& layout = table.layout();
  if (ticket.page_format != engine::PageFormatFingerprint(layout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", ticket.transfer_id, ": the receiver's page format ", ticket.page_format.ToHex(), " is not ours (",
        engine::PageFormatFingerprint(layout).ToHex(), "): another model layout or page size"));
  }
  const int64_t pages = layout.attention_layers > 0 ? layout.full_pages(ticket.n_tokens) : 0;
  if (ticket.num_pages != pages || ticket.page_bytes != layout.page_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer ", ticket.transfer_id, ": the ticket asks for ", ticket.num_pages, " pages of ", ticket.page_bytes,
        " bytes, ", ticket.n_tokens, " tokens make ", pages, " of ", layout.page_bytes()));
  }
  if (ticket.held_pages < 0 || ticket.held_pages > ticket.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", ticket.transfer_id, ": the receiver holds ",
                                                   ticket.held_pages, " of its ", ticket.num_pages, " pages"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SequenceStateSource> SequenceStateSource::Create(const engine::SequenceTable& table,
                                                                engine::SequenceId id, const Ticket& ticket,
                                                                const common::Hash128& model_fingerprint,
                                                                const common::Hash128& prefix_hash, int32_t first_token,
                                                                float first_logprob) {
  RETURN_IF_ERROR(CheckTicket(table, ticket));
  ASSIGN_OR_RETURN(const int64_t position, table.Position(id));
  if (position != ticket.n_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " is at position ", position, ", transfer ",
                                                   ticket.transfer_id, " expects ", ticket.n_tokens));
  }
  SequenceStateSource source;
  source.table_ = &table;
  source.id_ = id;
  source.num_pages_ = ticket.num_pages;
  RETURN_IF_ERROR(table.EncodeStateInto(id, /*with_logits=*/true, model_fingerprint, prefix_hash, &source.state_));
  if (static_cast<int64_t>(source.state_.size()) > ticket.max_state_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("state of ", source.state_.size(), " bytes exceeds the ticket's ", ticket.max_state_bytes));
  }
  source.first_token_ = first_token;
  source.first_logprob_ = first_logprob;
  return source;
}

absl::StatusOr<std::vector<MemoryRegion>> SequenceStateSource::PageRegions(int64_t index) const {
  ASSIGN_OR_RETURN(const std::vector<engine::PageRegion> regions, table_->ExportPageRegions(id_, index));
  std::vector<MemoryRegion> out;
  out.reserve(regions.size());
  for (const engine::PageRegion& r : regions) out.push_back(MemoryRegion{r.data, static_cast<size_t>(r.bytes)});
  return out;
}

absl::StatusOr<std::vector<absl::string_view>> SequenceStateSource::PageHostViews(int64_t index) const {
  ASSIGN_OR_RETURN(const engine::PageView view, table_->PageViews(id_, index));
  std::vector<absl::string_view> out;
  out.reserve(2 * view.k.size());
  for (size_t l = 0; l < view.k.size(); ++l) {
    // The wire order of engine/page_format.h: each layer's K, then its V.
    out.emplace_back(view.k[l].data(), view.k[l].size());
    out.emplace_back(view.v[l].data(), view.v[l].size());
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ReservationPageSink>> ReservationPageSink::Create(
    const engine::SequenceTable& table, const engine::ImportReservation& reservation) {
  const engine::StateLayout& layout = table.layout();
  const int64_t pages = layout.attention_layers > 0 ? layout.full_pages(reservation.n_tokens) : 0;
  std::unique_ptr<ReservationPageSink> sink(new ReservationPageSink());
  sink->pages_.resize(static_cast<size_t>(pages));
  for (int64_t i = 0; i < pages; ++i) {
    ASSIGN_OR_RETURN(const std::vector<engine::PageRegion> regions, table.ImportPageRegions(reservation.id, i));
    for (const engine::PageRegion& r : regions) {
      sink->pages_[static_cast<size_t>(i)].push_back(MemoryRegion{r.data, static_cast<size_t>(r.bytes)});
    }
  }
  return sink;
}

absl::Status ExpectReservation(StateReceiver& receiver, Ticket* ticket, const engine::SequenceTable& table,
                               const engine::ImportReservation& reservation) {
  return receiver.ExpectReservation(ticket, [&]() -> absl::StatusOr<std::unique_ptr<PageSink>> {
    return ReservationPageSink::Create(table, reservation);
  });
}

namespace {

// Marks the pages that came in place and checks the sampled ones by reading
// them back.
absl::Status MarkPagesInPlace(engine::SequenceTable& table, const engine::ImportReservation& reservation,
                              const ReceivedState& received, int64_t pages) {
  if (received.num_pages_in_place != pages) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", received.transfer_id, " brought ",
                                                   received.num_pages_in_place, " pages in place, the import needs ",
                                                   pages));
  }
  if (static_cast<int64_t>(received.page_checksums.size()) != SampledPages(pages)) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", received.transfer_id, " brought ",
                                                   received.page_checksums.size(), " sampled page checksums, ", pages,
                                                   " pages sample ", SampledPages(pages)));
  }
  for (int64_t i = 0; i < pages; ++i) RETURN_IF_ERROR(table.MarkPageImported(reservation.id, i));
  std::string page(static_cast<size_t>(table.layout().page_bytes()), '\0');
  int64_t expected_page = 0;
  for (const PageChecksum& sum : received.page_checksums) {
    while (expected_page < pages && !IsSampledPage(expected_page, pages)) ++expected_page;
    if (sum.page != expected_page) {
      return absl::InvalidArgumentError(absl::StrCat("transfer ", received.transfer_id, ": a checksum for page ",
                                                     sum.page, " where the sampling rule names page ", expected_page));
    }
    ++expected_page;
    RETURN_IF_ERROR(table.ImportedPageInto(reservation.id, sum.page, absl::MakeSpan(page)));
    const uint64_t landed = common::Checksum64(page.data(), page.size());
    if (landed != sum.checksum) {
      return absl::DataLossError(absl::StrCat("transfer ", received.transfer_id, ": page ", sum.page,
                                              " landed in place with checksum ", landed, ", the sender's is ",
                                              sum.checksum));
    }
  }
  return absl::OkStatus();
}

absl::Status ImportOrError(engine::SequenceTable& table, const engine::ImportReservation& reservation,
                           const ReceivedState& received, int64_t held_pages) {
  const engine::StateLayout& layout = table.layout();
  const int64_t pages = layout.attention_layers > 0 ? layout.full_pages(reservation.n_tokens) : 0;
  if (held_pages < 0 || held_pages > pages || received.first_page < 0 || received.first_page > held_pages ||
      (received.pages_in_place && received.first_page != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", received.transfer_id, " was sent from page ",
                                                   received.first_page, (received.pages_in_place ? " in place" : ""),
                                                   "; the receiver holds ", held_pages, " of its ", pages, " pages"));
  }
  const int64_t kept = received.first_page;  // the receiver's pages before the sender's
  if (!received.pages_in_place && static_cast<int64_t>(received.pages.size()) != pages - kept) {
    return absl::InvalidArgumentError(absl::StrCat("transfer ", received.transfer_id, " brought ",
                                                   received.pages.size(), " pages from page ", kept,
                                                   ", the import needs ", pages - kept));
  }
  engine::SnapshotExpectation expect;
  expect.layout = layout;
  expect.position = reservation.n_tokens;
  // Parse (and checksum) the state before any page is written.
  ASSIGN_OR_RETURN(const engine::SnapshotView view, engine::ParseSnapshot(received.state, expect));
  if (received.pages_in_place) {
    RETURN_IF_ERROR(MarkPagesInPlace(table, reservation, received, pages));
  } else {
    for (int64_t i = 0; i < kept; ++i) RETURN_IF_ERROR(table.MarkPageImported(reservation.id, i));
    for (int64_t i = 0; i < received.pages.size(); ++i) {
      RETURN_IF_ERROR(table.ImportPage(reservation.id, kept + i, received.pages[i]));
    }
  }
  return table.FinishImport(reservation.id, view);
}

}  // namespace

absl::Status ImportReceived(engine::SequenceTable& table, const engine::ImportReservation& reservation,
                            const ReceivedState& received, int64_t held_pages) {
  absl::Status status = ImportOrError(table, reservation, received, held_pages);
  if (!status.ok()) {
    const absl::Status aborted = table.AbortImport(reservation.id);
    if (!aborted.ok() && !absl::IsNotFound(aborted)) {
      return absl::Status(status.code(), absl::StrCat(status.message(), "; abort: ", aborted.message()));
    }
  }
  return status;
}

}  // namespace hybridserve::transport
