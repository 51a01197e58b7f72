#ifndef HYBRIDSERVE_TRANSPORT_IN_PROCESS_TRANSPORT_H_
#define HYBRIDSERVE_TRANSPORT_IN_PROCESS_TRANSPORT_H_

// The data plane between two engines in one process (tests; a disaggregated
// pair without sockets): Send copies the source's pages and state into the
// receiver's book, where Await finds them. The same ticket checks as on the
// wire: unknown ids, another secret (UNAUTHENTICATED) and size mismatches are
// refused.
//
// Thread-safe.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/transfer.h"
#include "transport/transfer_registry.h"

namespace hybridserve::transport {

class InProcessTransport final : public StateSender, public StateReceiver {
 public:
  InProcessTransport() = default;

  absl::Status Send(const Ticket& ticket, const StateSource& source) override;

  TransportKind kind() const override { return TransportKind::kInProcess; }
  absl::Status Expect(const Ticket& ticket) override { return registry_.Expect(ticket); }
  absl::StatusOr<ReceivedState> Await(uint64_t transfer_id) override { return registry_.Await(transfer_id); }
  void Cancel(uint64_t transfer_id) override { registry_.Cancel(transfer_id); }
  int64_t pending() const override { return registry_.pending(); }
  int64_t refused() const override { return registry_.refused(); }
  int64_t unauthenticated() const override { return registry_.unauthenticated(); }

 private:
  TransferRegistry registry_;
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_IN_PROCESS_TRANSPORT_H_
