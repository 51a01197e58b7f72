#ifndef HYBRIDSERVE_COMMON_LOGGING_H_
#define HYBRIDSERVE_COMMON_LOGGING_H_

// Logging is glog (abseil 20220623 has no absl/log). Include this header, not
// glog directly, so the choice stays in one place.

#include <glog/logging.h>

namespace hybridserve::common {

// Initializes glog for a service binary: logs to stderr, installs the failure
// signal handler. Call once from main() before any other thread starts.
void InitLogging(const char* argv0);

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_LOGGING_H_
