#include "transport/routing_sender.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace hybridserve::transport {
namespace {

size_t IndexOf(TransportKind kind) {
  const int k = static_cast<int>(kind);
  return k >= 0 && k < 5 ? static_cast<size_t>(k) : 0;
}

}  // namespace

void RoutingStateSender::Route(TransportKind kind, StateSender* sender) {
  if (const size_t i = IndexOf(kind); i != 0) senders_[i] = sender;
}

absl::Status RoutingStateSender::Send(const Ticket& ticket, const StateSource& source) {
  StateSender* sender = senders_[IndexOf(ticket.kind)];
  if (sender != nullptr) return sender->Send(ticket, source);
  std::string served;
  for (TransportKind k :
       {TransportKind::kInProcess, TransportKind::kTcp, TransportKind::kNccl, TransportKind::kCudaIpc}) {
    if (senders_[IndexOf(k)] != nullptr) absl::StrAppend(&served, served.empty() ? "" : ", ", TransportKindName(k));
  }
  return absl::InvalidArgumentError(absl::StrCat("transfer ", ticket.transfer_id, ": ticket.transport ",
                                                 TransportKindName(ticket.kind), " is not served by this worker (",
                                                 served.empty() ? "none" : served, ")"));
}

}  // namespace hybridserve::transport
