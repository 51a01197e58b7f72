#ifndef HYBRIDSERVE_CACHESTORE_SERVER_CALL_ADMISSION_H_
#define HYBRIDSERVE_CACHESTORE_SERVER_CALL_ADMISSION_H_

// Bounds the calls a server has in flight: over all clients, and from one
// client connection. A call takes a slot when it starts and gives it back
// when it ends (its reactor's OnDone); a call that finds no free slot is
// refused at once with RESOURCE_EXHAUSTED, so a client that opens streams
// and stalls them holds at most its share and never a thread.

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hybridserve::cachestore {

// Thread-safe. Must outlive every Slot it hands out.
class CallAdmission {
 public:
  // One admitted call's place; given back when destroyed. Move-only.
  class Slot {
   public:
    Slot(Slot&& other) noexcept;
    Slot& operator=(Slot&& other) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot();

   private:
    friend class CallAdmission;
    Slot(CallAdmission* admission, std::string peer) : admission_(admission), peer_(std::move(peer)) {}

    CallAdmission* admission_;  // null once moved from
    std::string peer_;
  };

  // `max_calls`: calls in flight over all clients (--max_streams);
  // `max_calls_per_peer`: from one peer (--max_streams_per_peer). Both >= 1.
  CallAdmission(int64_t max_calls, int64_t max_calls_per_peer);

  // A slot for a call from `peer` (grpc::ServerContextBase::peer(): one
  // client connection), or RESOURCE_EXHAUSTED naming the flag and the limit
  // that refused it, or UNAVAILABLE once closed.
  absl::StatusOr<Slot> Admit(absl::string_view peer) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_);

  // The drain: every later Admit is UNAVAILABLE ("draining"); the calls in
  // flight go on.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no call is in flight; false at `deadline`.
  bool AwaitIdle(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Release(const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);

  const int64_t max_calls_;
  const int64_t max_calls_per_peer_;
  mutable absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Peers with at least one call in flight.
  absl::flat_hash_map<std::string, int64_t> per_peer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SERVER_CALL_ADMISSION_H_
