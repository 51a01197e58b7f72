#include "transport/in_process_transport.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hybridserve::transport {

absl::Status InProcessTransport::Send(const Ticket& ticket, const StateSource& source) {
  // The pages the receiver holds are the sender's ticket's word (as on TCP);
  // the import checks them against what it holds. A ticket that cannot
  // hold them is refused before the transfer begins, as TCP's sender does.
  const int64_t held = ticket.held_pages;
  if (held < 0 || held > ticket.num_pages) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", ticket.transfer_id, ": ", held, " pages held of ", ticket.num_pages));
  }
  ASSIGN_OR_RETURN(const Ticket expected, registry_.Begin(ticket.transfer_id, ticket.secret));
  absl::Status mismatch;
  if (source.num_pages() != expected.num_pages || source.page_bytes() != expected.page_bytes ||
      static_cast<int64_t>(source.state().size()) > expected.max_state_bytes) {
    mismatch = absl::InvalidArgumentError(absl::StrCat(
        "transfer ", ticket.transfer_id, ": ", source.num_pages(), " pages of ", source.page_bytes(),
        " bytes and a state of ", source.state().size(), " bytes do not fit the ticket (", expected.num_pages,
        " pages of ", expected.page_bytes, ", state up to ", expected.max_state_bytes, ")"));
  }
  ReceivedState received;
  received.transfer_id = ticket.transfer_id;
  received.first_page = held;
  if (mismatch.ok()) received.pages = PageBlock(source.num_pages() - held, source.page_bytes());
  for (int64_t i = held; i < source.num_pages() && mismatch.ok(); ++i) {
    mismatch = source.ReadPage(i, received.pages.mutable_page(i - held));
  }
  if (!mismatch.ok()) {
    registry_.Fail(ticket.transfer_id, mismatch);
    return mismatch;
  }
  received.state = std::string(source.state());
  received.first_token = source.first_token();
  received.first_logprob = source.first_logprob();
  return registry_.Complete(ticket.transfer_id, std::move(received));
}

}  // namespace hybridserve::transport
