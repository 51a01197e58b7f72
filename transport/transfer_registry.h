#ifndef HYBRIDSERVE_TRANSPORT_TRANSFER_REGISTRY_H_
#define HYBRIDSERVE_TRANSPORT_TRANSFER_REGISTRY_H_

// The receiving side's book of expected transfers, shared by every
// StateReceiver implementation: which ids are expected, which have begun
// arriving, and their outcome for Await.
//
// A transfer is expected (Expect), begun by at most one sender (Begin hands
// out its ticket once, to a sender that presents the ticket's secret), then
// completed or failed; Await returns the outcome and forgets it. Await past
// the ticket's deadline, and Cancel, forget it too; a sender still holding a
// begun transfer then finds it gone at Complete.
//
// Two counts of refusals, disjoint: refused() for senders that proved their
// ticket (its secret) and were refused all the same (a transfer already begun
// or finished, and what the planes count with CountRefused: sizes,
// checksums, cancelled mid-transfer; also TCP connections beyond
// max_connections, closed before a byte is read), unauthenticated() for
// those that did not prove a ticket (Begin's UNAUTHENTICATED, and what the
// planes count with CountUnauthenticated: a TCP connection that never sent
// an intact begin).
//
// Thread-safe: every method locks mu_.

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "transport/transfer.h"

namespace hybridserve::transport {

class TransferRegistry {
 public:
  // Bounds on what a ticket may announce, so that a bad ticket cannot make a
  // receiver reserve unbounded memory.
  struct Limits {
    int64_t max_pages = int64_t{1} << 24;
    int64_t max_page_bytes = int64_t{1} << 30;
    int64_t max_state_bytes = int64_t{1} << 34;
  };

  TransferRegistry() : TransferRegistry(Limits()) {}
  explicit TransferRegistry(const Limits& limits) : limits_(limits) {}

  // INVALID_ARGUMENT for an id already expected, sizes out of range, or a
  // secret that is not kTransferSecretBytes long.
  absl::Status Expect(const Ticket& ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // The ticket of an expected transfer that no sender has begun, for a
  // sender that presents its `secret`; marks it begun. Every refusal leaves
  // the transfer as it was (its rightful sender can still begin it):
  // UNAUTHENTICATED, counted in unauthenticated(), when no transfer of that
  // id is expected (never was, or no longer: cancelled, past its deadline,
  // awaited; its secret went with it, so a late sender cannot be told from a
  // stranger) or `secret` is not its ticket's (SecretsEqual: constant time);
  // then NOT_FOUND when it has finished and waits for Await, ALREADY_EXISTS
  // when another sender began it, both counted in refused().
  absl::StatusOr<Ticket> Begin(uint64_t transfer_id, absl::string_view secret) ABSL_LOCKS_EXCLUDED(mu_);
  // The outcome of a begun transfer. NOT_FOUND when it was forgotten
  // meanwhile (cancelled, deadline): the bytes are dropped.
  absl::Status Complete(uint64_t transfer_id, ReceivedState state) ABSL_LOCKS_EXCLUDED(mu_);
  void Fail(uint64_t transfer_id, const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ReceivedState> Await(uint64_t transfer_id) ABSL_LOCKS_EXCLUDED(mu_);
  void Cancel(uint64_t transfer_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts bytes refused for a reason found outside the registry (a bad
  // frame, a mismatch) from a sender that proved its ticket, or whose peer
  // is trusted otherwise (a channel's: channel_protocol.h); and TCP
  // connections beyond max_connections.
  void CountRefused() ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a peer dropped before it proved any ticket, for a reason found
  // outside the registry (a TCP connection without an intact begin frame).
  void CountUnauthenticated() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t pending() const ABSL_LOCKS_EXCLUDED(mu_);
  // Await calls blocked waiting for their transfer (for tests: an outcome
  // that must reach a waiting Await).
  int64_t awaiting() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t unauthenticated() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    Ticket ticket;
    bool begun = false;
    bool done = false;
    absl::Status status;  // when done: OK (state holds the bytes) or the failure
    ReceivedState state;
  };

  const Limits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t awaiting_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t unauthenticated_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_TRANSFER_REGISTRY_H_
