#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what is
# missing, then
#   1. builds and tests every target (the plain configuration; this includes
#      //tests/k8s:run_manifests_test, which runs the cpu and cpu-mtls overlays' pods as
#      local processes in its own network and mount namespaces: root or
#      unprivileged user namespaces);
#   1b. the Python client as a user installs it: a fresh venv, `pip install
#      "./client/python[text]"` from PyPI, and the installed package against
#      the real stack (client/python/tests/venv_install_test.sh; needs PyPI:
#      HS_VENV_TEST=0 skips it, and says so);
#   2. ASan + UBSan (and LSan) over every target (--config=asan; the k8s
#      run test then runs the sanitized binaries);
#   3. TSan over //kernels/..., //engine/..., //transport/..., //decode/... and
#      the threaded cores without a gRPC server (the cache publisher, the
#      prefill worker, common::Cancellation, the disk tier and the store's
#      writer thread, the shm socket's and the bulk
#      port's servers and clients: their tests' cases without gRPC)
#      (not the CUDA emulator's fiber tests, tagged notsan). Debian's abseil
#      is not instrumented: third_party/tsan/libabsl_tsan_shim.so, preloaded,
#      tells TSan about absl::Mutex's happens-before edges, and
#      third_party/tsan/suppressions.txt silences what gRPC's own
#      uninstrumented internals hand between threads. Left out: tests that
#      run a gRPC server in process (//prefill:grpc_prefill_client_test, the
#      cachestore, prefill, the end-to-end tests), whose reports come from
#      inside gRPC and its libraries (upb, absl::Status hand-overs) faster
#      than suppressions can name them;
#   4. checks that the committed fixtures are current (tools/check_fixtures.py;
#      skipped, and says so, where torch and transformers are not installed).
# Each stage prints one summary line (targets and cases passed, failed,
# skipped), every skipped case with its reason, and its slowest targets with
# their seconds (HS_SLOWEST of them, 15 by default); at the end, every
# stage's wall time and the total. The exit status is the first failing
# stage's. Not here: the GPU bundle and its check
# (tools/gpu_bundle.sh, which runs tools/gpu_bundle_check.sh), a separate step
# that needs an -c opt build of every GPU target and a minute of compression.
#
#   tools/run_tests.sh                 all stages
#   HS_SANITIZERS=0 tools/run_tests.sh the plain stage (with the venv test and the fixture check) only
#   tools/run_tests.sh ARGS...         the plain stage with extra `bazel test` args
#                                      (e.g. --config=asan //engine/...), nothing else
set -uo pipefail
cd "$(dirname "$0")/.."
slowest="${HS_SLOWEST:-15}"
# Wall time of each step, printed at the end: "LABEL<tab>SECONDS" entries.
times=()
run_began=$(date +%s)
# timed LABEL COMMAND...: runs COMMAND, records its wall time under LABEL,
# and returns its status.
timed() {
  local label=$1
  shift
  local began rc
  began=$(date +%s)
  "$@"
  rc=$?
  times+=("${label}	$(($(date +%s) - began))")
  return $rc
}
print_times() {
  echo "=== wall time by stage"
  local line
  for line in "${times[@]}"; do
    printf 'STAGE %6d s  %s\n' "${line##*	}" "${line%	*}"
  done
  printf 'STAGE %6d s  total\n' "$(($(date +%s) - run_began))"
}

timed "bootstrap" tools/bootstrap.sh || exit 1

# Free disk where Bazel keeps its outputs: a full disk fails a stage with
# "No space left on device" deep in its log (the three configurations'
# outputs take 6-9 GB), so say it up front.
bazel_root="${HOME}/.cache/bazel"
mkdir -p "${bazel_root}"
free_kib=$(df -Pk "${bazel_root}" | awk 'NR == 2 { print $4 }')
echo "=== free disk under ${bazel_root}: $((free_kib / 1048576)) GiB"
if [ "${free_kib:-0}" -lt $((12 * 1048576)) ]; then
  echo "WARNING: under 12 GiB free; the sanitizer stages may run out of disk" >&2
fi

status=0
# stage LABEL BAZEL_ARGS... -- PATTERNS...
stage() {
  local label=$1
  shift
  local args=() patterns=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  patterns=("$@")
  echo "=== ${label}: bazel test ${args[*]} ${patterns[*]}"
  timed "${label}" bazel test "${args[@]}" -- "${patterns[@]}"
  local rc=$?
  python3 tools/test_summary.py --label "${label}" --times "${slowest}" \
    --testlogs "$(bazel info "${args[@]}" bazel-testlogs 2>/dev/null)" -- "${patterns[@]}"
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
}

if [ $# -gt 0 ]; then
  # Extra arguments: one plain run with them (patterns may be among them).
  has_pattern=0
  for a in "$@"; do case "$a" in //*) has_pattern=1 ;; esac; done
  if [ $has_pattern -eq 1 ]; then
    timed "bazel test $*" bazel test "$@"
    status=$?
    patterns=()
    for a in "$@"; do case "$a" in //*) patterns+=("$a") ;; esac; done
    opts=()
    for a in "$@"; do case "$a" in //*) ;; *) opts+=("$a") ;; esac; done
    python3 tools/test_summary.py --label "bazel test $*" --times "${slowest}" \
      --testlogs "$(bazel info "${opts[@]}" bazel-testlogs 2>/dev/null)" "${patterns[@]}"
  else
    stage "bazel test //... $*" "$@" -- //...
  fi
  print_times
  exit $status
fi

stage "plain" -- //...
if [ "${HS_VENV_TEST:-1}" != "0" ]; then
  echo "=== venv: pip install ./client/python, the installed client on the real stack"
  timed "venv" client/python/tests/venv_install_test.sh || { [ $status -eq 0 ] && status=1; }
else
  echo "=== venv: SKIPPED (HS_VENV_TEST=0)"
fi
if [ "${HS_SANITIZERS:-1}" != "0" ]; then
  stage "asan+ubsan" --config=asan -- //...
  # Tests tagged notsan run the CUDA emulator's fibers, which TSan cannot follow.
  timed "tsan shim" bazel build --config=tsan //third_party/tsan:libabsl_tsan_shim.so || status=1
  shim="$(bazel info --config=tsan bazel-bin 2>/dev/null)/third_party/tsan/libabsl_tsan_shim.so"
  stage "tsan" --config=tsan --test_tag_filters=-notsan --build_tag_filters=-notsan \
    --test_env=LD_PRELOAD="${shim}" --test_env=TSAN_OPTIONS="suppressions=${PWD}/third_party/tsan/suppressions.txt" \
    -- //kernels/... //engine/... //transport/... //decode/... //cachestore/client:cache_publisher_test \
    //common:cancellation_test //prefill:prefill_worker_test //cachestore/index:cache_store_disk_test \
    //cachestore/index:disk_tier_test
  # The direct paths' servers and clients without gRPC: the cases of these
  # tests that run no gRPC server (the others are left out, as above).
  stage "tsan (gRPC-free cases)" --config=tsan \
    --test_filter='ShmPutTest.*:CacheStoreFileWriteTest.*:BulkLocalTest.*' \
    --test_env=LD_PRELOAD="${shim}" --test_env=TSAN_OPTIONS="suppressions=${PWD}/third_party/tsan/suppressions.txt" \
    -- //cachestore/testing:shm_put_test //cachestore/index:cache_store_test //cachestore/testing:bulk_local_test
fi
# numpy comes from Debian (tools/bootstrap.sh: python3-numpy) for /usr/bin/python3;
# a python3 earlier on PATH (pyenv, a venv) may not have it.
py=python3
"$py" -c "import numpy" 2>/dev/null || py=/usr/bin/python3
timed "fixtures" "$py" tools/check_fixtures.py || { [ $status -eq 0 ] && status=1; }
print_times
exit $status
