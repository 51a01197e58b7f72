#include "common/runfiles.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hybridserve::common {

std::string Runfile(absl::string_view relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return std::string(relative);
  return absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "hybridserve", "/", relative);
}

}  // namespace hybridserve::common
