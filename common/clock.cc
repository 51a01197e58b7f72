#include "common/clock.h"

namespace hybridserve::common {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock& Clock::Real() {
  static RealClock* const clock = new RealClock();
  return *clock;
}

}  // namespace hybridserve::common
