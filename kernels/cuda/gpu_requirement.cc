#include "kernels/cuda/gpu_requirement.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace hybridserve::kernels::cuda_testing {

int RequiredGpus() {
  const char* value = std::getenv("HS_REQUIRE_GPUS");
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(value, &end, 10);
  if (errno != 0 || *end != '\0' || n < 0 || n > 1024) {
    ADD_FAILURE() << "HS_REQUIRE_GPUS=\"" << value << "\" is not a GPU count";
    return 0;
  }
  return static_cast<int>(n);
}

bool HaveGpusOrSkip(int needed, int found, const char* why) {
  if (found >= needed) return true;
  const std::string need = "this test needs " + std::to_string(needed) + " CUDA device" + (needed == 1 ? "" : "s") +
                           (why != nullptr ? std::string(" (") + why + ")" : std::string());
  // FAIL() and GTEST_SKIP() return from their function: a lambda's here.
  if (found < 0) {
    [&] {
      FAIL() << "CUDA error " << -found << " while counting devices: a GPU machine whose CUDA setup is broken; "
             << need;
    }();
    return false;
  }
  const int required = RequiredGpus();
  if (required >= needed) {
    [&] { FAIL() << "HS_REQUIRE_GPUS=" << required << " but this machine has " << found << ": " << need; }();
    return false;
  }
  [&] {
    GTEST_SKIP() << need << " and this machine has " << found << (found == 0 ? " (no driver or no GPU)" : "")
                 << ": this test never ran on a GPU";
  }();
  return false;
}

}  // namespace hybridserve::kernels::cuda_testing
