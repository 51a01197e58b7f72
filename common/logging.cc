#include "common/logging.h"

namespace hybridserve::common {

void InitLogging(const char* argv0) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv0);
  google::InstallFailureSignalHandler();
}

}  // namespace hybridserve::common
