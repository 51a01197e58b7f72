#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what is
# missing, then builds and tests every target, then prints one summary line
# (targets and cases passed, failed, skipped) and every skipped case with its
# reason. Extra arguments go to `bazel test` (e.g. --config=asan).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh || exit 1
bazel test //... "$@"
rc=$?
python3 tools/test_summary.py --label "bazel test //... $*" --testlogs "$(bazel info "$@" bazel-testlogs 2>/dev/null)" //...
exit $rc
