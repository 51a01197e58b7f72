#include "common/log_rate_limiter.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace hybridserve::common {

bool LogRateLimiter::Allow(absl::string_view reason, int64_t* held_back) {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  Reason& r = reasons_[reason];
  if (now - r.last < interval_) {
    ++r.held_back;
    return false;
  }
  r.last = now;
  *held_back = r.held_back;
  r.held_back = 0;
  return true;
}

std::string HeldBack(int64_t n) { return n > 0 ? absl::StrCat(" (", n, " more like it held back)") : std::string(); }

std::string FailureReason(const absl::Status& status) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
}

}  // namespace hybridserve::common
