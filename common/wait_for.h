#ifndef HYBRIDSERVE_COMMON_WAIT_FOR_H_
#define HYBRIDSERVE_COMMON_WAIT_FOR_H_

// Tests' one way to wait for a condition another thread or process brings
// about, instead of sleeping a fixed time.

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hybridserve::common {

// Polls `condition` until it holds or `deadline` passes; returns whether it
// held. The deadline bounds a hung component, far above what any step takes;
// it is never a timing expectation.
inline bool WaitFor(const std::function<bool()>& condition, absl::Duration deadline = absl::Seconds(60)) {
  const absl::Time end = absl::Now() + deadline;
  while (!condition()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_WAIT_FOR_H_
