#ifndef HYBRIDSERVE_COMMON_RUNFILES_H_
#define HYBRIDSERVE_COMMON_RUNFILES_H_

// Tests' one way to find a data dependency (a `data` label of the test).

#include <string>

#include "absl/strings/string_view.h"

namespace hybridserve::common {

// The path of `relative` (from the workspace root, e.g.
// "tests/fixtures/golden/nemotron_h_tiny") under this test's runfiles:
// $TEST_SRCDIR/$TEST_WORKSPACE/relative ("hybridserve" when TEST_WORKSPACE is
// unset), or `relative` itself outside `bazel test` (no TEST_SRCDIR), where the
// working directory is the workspace root.
std::string Runfile(absl::string_view relative);

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_RUNFILES_H_
