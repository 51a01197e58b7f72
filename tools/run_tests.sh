#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what is
# missing, then builds and tests every target.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
bazel test //... "$@"
