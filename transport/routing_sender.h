#ifndef HYBRIDSERVE_TRANSPORT_ROUTING_SENDER_H_
#define HYBRIDSERVE_TRANSPORT_ROUTING_SENDER_H_

// A prefill worker's StateSender over several data planes: each ticket goes
// to the sender of its kind (Ticket::kind, set by the decode worker's
// receiver), so one prefill pool serves decode workers on TCP and on NCCL.
//
// Thread-safe (the senders are).

#include <array>

#include "absl/status/status.h"
#include "transport/transfer.h"

namespace hybridserve::transport {

class RoutingStateSender final : public StateSender {
 public:
  RoutingStateSender() = default;

  // Serves tickets of `kind` with `sender` (null: refuses them). `sender`
  // must outlive this one. Not thread-safe: set up before the first Send.
  void Route(TransportKind kind, StateSender* sender);

  // The routed sender's Send; INVALID_ARGUMENT, naming the kind and what this
  // worker serves, for a kind without a sender.
  absl::Status Send(const Ticket& ticket, const StateSource& source) override;

 private:
  std::array<StateSender*, 5> senders_ = {};  // by TransportKind value
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_ROUTING_SENDER_H_
