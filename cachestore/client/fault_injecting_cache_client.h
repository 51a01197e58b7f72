#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_FAULT_INJECTING_CACHE_CLIENT_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_FAULT_INJECTING_CACHE_CLIENT_H_

// A CacheClient that wraps another and makes the cache look down, slow or
// wrong on command, for tests of docs/ARCHITECTURE.md section 6: "the cachestore being
// down, slow or wrong never fails a request".

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/cache_client.h"

namespace hybridserve::cachestore {

// The methods of CacheClient that faults can target (Get is GetInto).
enum class CacheClientMethod { kLookup = 0, kPut, kGetInto, kRelease, kStats, kGetManyInto, kPutMany };
inline constexpr int kCacheClientMethods = 7;

// Thread-safe. Each call first counts itself, then sleeps the method's delay
// (through the injected hook, outside the lock), then either fails with an
// armed status without calling the wrapped client ("down": nothing reaches the
// cache), or calls it; a successful GetInto may then have its bytes corrupted
// ("wrong": bytes that passed the cache's checksum but are not what was put).
// Faults apply in arrival order when calls race.
class FaultInjectingCacheClient final : public CacheClient {
 public:
  using SleepFn = std::function<void(absl::Duration)>;

  // `inner` must outlive this client. `sleep` performs delays; tests pass a
  // hook that records them or advances a FakeClock instead of sleeping.
  explicit FaultInjectingCacheClient(CacheClient& inner, SleepFn sleep = absl::SleepFor);

  // The next `count` calls of `method` fail with `status` (not OK), replacing
  // what was armed for it before; count 0 disarms.
  void FailNext(CacheClientMethod method, int count, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  // Every later call of `method` sleeps `delay` first; zero removes it.
  void SetDelay(CacheClientMethod method, absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_);

  // The next `count` successful GetInto calls return their bytes with the
  // first byte's bits inverted (an empty entry stays empty). GetManyInto's
  // entries are never corrupted (it is a method of its own: failures and
  // delays target it as kGetManyInto).
  void CorruptNextGets(int count) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes every armed failure, delay and corruption; call counts stay.
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

  // Calls of `method` so far, failed ones included.
  int64_t calls(CacheClientMethod method) const ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<LookupResult> Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                      LookupMode mode) override;
  absl::StatusOr<PutResult> Put(const ClientNamespace& ns, const ClientPut& put, absl::string_view bytes) override;
  absl::Status GetInto(uint64_t lease_id, const Hash128& key, std::string* out) override;
  absl::Status GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out) override;
  // A failure armed for kPutMany fails every entry (nothing reaches the
  // cache); otherwise CacheClient's default, one Put of this client per entry,
  // so that Put's faults and delays strike the entries one by one.
  std::vector<absl::StatusOr<PutResult>> PutMany(const ClientNamespace& ns,
                                                 absl::Span<const PutManyEntry> entries) override;
  absl::Status Release(uint64_t lease_id) override;
  absl::StatusOr<IndexStats> Stats() override;

 private:
  struct MethodFaults {
    int64_t calls = 0;
    int fail_remaining = 0;
    absl::Status failure;
    absl::Duration delay = absl::ZeroDuration();
  };

  // Counts the call, sleeps its delay and returns the armed failure, if any
  // (OK: go on to the wrapped client).
  absl::Status Enter(CacheClientMethod method) ABSL_LOCKS_EXCLUDED(mu_);

  CacheClient& inner_;
  const SleepFn sleep_;
  mutable absl::Mutex mu_;
  std::array<MethodFaults, kCacheClientMethods> faults_ ABSL_GUARDED_BY(mu_);
  int corrupt_gets_remaining_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_FAULT_INJECTING_CACHE_CLIENT_H_
