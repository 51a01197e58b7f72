#include "common/grpc_runtime.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "grpc/grpc.h"

namespace hybridserve::common {

GrpcRuntime::GrpcRuntime() { grpc_init(); }

GrpcRuntime::~GrpcRuntime() {
  grpc_shutdown_blocking();
  // gRPC's own objects hold references too (each subchannel, each HTTP/2
  // transport, the event engine) and drop them on its executor threads after
  // the channels and servers that used them are gone. The last one to go
  // shuts gRPC down on a thread of its own, holding the lock that
  // grpc_is_initialized takes: once that reads false, the shutdown is over.
  const absl::Time deadline = absl::Now() + kShutdownWait;
  while (grpc_is_initialized() != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  if (grpc_is_initialized() != 0) {
    LOG(WARNING) << "gRPC is still up " << kShutdownWait
                 << " after its runtime's scope: a gRPC object outlived it, and gRPC's threads may outlive "
                    "OpenSSL's cleanup at exit (see common/grpc_runtime.h)";
  }
}

}  // namespace hybridserve::common
