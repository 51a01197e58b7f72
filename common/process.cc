#include "common/process.h"

#include <malloc.h>

#include "absl/synchronization/mutex.h"

namespace hybridserve::common {

void TuneProcessForServing() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace hybridserve::common
