#include "common/connection_age.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/logging.h"
#include "grpc/grpc.h"

namespace hybridserve::common {
namespace {

// gRPC's channel arguments are ints of milliseconds.
int Milliseconds(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1)));
  return static_cast<int>(std::clamp<int64_t>(ms, 1, INT_MAX));
}

}  // namespace

void ApplyConnectionAge(const ConnectionAge& age, grpc::ServerBuilder& builder) {
  CHECK(age.max_age >= absl::ZeroDuration() && age.grace >= absl::ZeroDuration()) << "negative connection age or grace";
  if (age.max_age == absl::ZeroDuration()) return;
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, Milliseconds(age.max_age));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                             age.grace == absl::ZeroDuration() ? INT_MAX : Milliseconds(age.grace));
}

}  // namespace hybridserve::common
