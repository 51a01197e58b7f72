#!/usr/bin/env bash
# Checks a GPU bundle (tools/gpu_bundle.sh) on this machine, without a GPU:
#   1. every binary's libraries resolve inside the bundle (its own loader,
#      lib/ only), except the CUDA sonames the bundle states it takes from the
#      GPU machine (host_sonames.txt): any other library it lacks is listed;
#   2. every binary starts from the bundle in a clean environment (env -i: no
#      LD_LIBRARY_PATH, no PATH): the tests list their cases, the services
#      print their flags, and the CPU-runnable paths run: the kernel and
#      transfer benchmarks on the CUDA emulator, serving_bench's resume figure
#      on the CPU (cachestore, decode and prefill started through the runfiles
#      launchers), the CPU and emulated cases of a kernel test;
#   3. HS_REQUIRE_GPUS=1 turns a GPU case without a GPU into a failure.
# Exit status 0 when all hold.
#
#   tools/gpu_bundle_check.sh gpu_bundle/hs-gpu-bundle.tar.xz   (or an unpacked bundle folder)
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUNDLE.tar.xz|BUNDLE_DIR" >&2; exit 2; }

work=$(mktemp -d /tmp/hs-gpu-bundle-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -d "$1" ]; then
  b=$(cd "$1" && pwd)
else
  tar -C "$work" -xJf "$1" || exit 1
  b=$work/hs-gpu-bundle
fi
# The tests' fixtures (fixtures.txt) are not packed: link them in from this
# repository, as run.sh does from the device's repository copy.
repo=$(cd "$(dirname "$0")/.." && pwd)
while read -r p; do
  [ -e "$repo/$p" ] || { echo "no $repo/$p" >&2; exit 1; }
  mkdir -p "$(dirname "$b/runfiles/hybridserve/$p")"
  ln -sfn "$repo/$p" "$b/runfiles/hybridserve/$p"
done <"$b/fixtures.txt"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

echo "== 1. libraries (the bundle's loader, --library-path lib only)"
host_sonames=$(tr '\n' ' ' <"$b/host_sonames.txt")
lacking=""
for f in "$b"/libexec/*; do
  listing=$(env -i "$b/lib/ld-linux-x86-64.so.2" --library-path "$b/lib" --list "$f" 2>&1) ||
    fail "${f##*/}: the loader cannot list it: $listing"
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case " $host_sonames " in *" $soname "*) continue ;; esac
    case "$path" in "$b"/lib/*) continue ;; esac
    lacking="$lacking $soname"
    fail "${f##*/} needs $soname: the bundle lacks it (here it resolves to $path)"
  done <<<"$listing"
done
echo "host sonames (from the GPU machine): $host_sonames"
[ -z "$lacking" ] && echo "no other library is missing from the bundle"

echo "== 2. every binary starts with env -i"
# run NAME EXPECT_RC TIMEOUT CMD...: CMD from the bundle's root with a clean
# environment plus the runfiles variables.
run() {
  local name=$1 expect=$2 limit=$3
  shift 3
  local log=$work/$name.log rc
  (cd "$b" && env -i TEST_SRCDIR="$b/runfiles" TEST_WORKSPACE=hybridserve TEST_TMPDIR="$work/tmp" \
    timeout "$limit" "$@") >"$log" 2>&1
  rc=$?
  if [ "$rc" = "$expect" ]; then
    echo "ok   $name (exit $rc)"
  else
    fail "$name exited $rc, expected $expect; its log ends:"
    tail -5 "$log" | sed 's/^/       /'
  fi
}
mkdir -p "$work/tmp"
for f in "$b"/libexec/*_test; do
  n=${f##*/}
  run "$n --gtest_list_tests" 0 60 "bin/$n" --gtest_list_tests
  grep -q '^  ' "$work/$n --gtest_list_tests.log" || fail "$n listed no test cases"
done
# absl's --helpfull exits 1 after printing the flags.
for n in decode prefill cachestore; do
  run "$n --helpfull" 1 30 "bin/$n" --helpfull
  grep -q -- '--address' "$work/$n --helpfull.log" || fail "$n --helpfull printed no --address flag"
done
run "cuda_kernels_bench --emulated --small" 0 300 bin/cuda_kernels_bench --emulated --small --reps=1 --calls=1
run "gpu_transfer_bench --emulated" 0 120 bin/gpu_transfer_bench --plane=cuda_ipc --emulated --sizes=1048576 --reps=1
run "throughput_bench --device=cpu" 0 120 bin/throughput_bench --device=cpu \
  --model="$b/runfiles/hybridserve/models/default" --prefill=64 --batches=1 --decode_steps=4 --reps=1 --max_tries=1 \
  --max_other_cpu=1000
# The default model's context (8192) is too short for the disagg figure's
# prompts; the resume figure starts the same processes, and a cachestore.
run "serving_bench resume on the cpu" 0 300 bin/serving_bench --only=resume --device=cpu \
  --model_dir="$b/runfiles/hybridserve/models/default" --histories=256 --reps=1
grep -q 'EXACT_PREFIX\|GRID' "$work/serving_bench resume on the cpu.log" ||
  fail "serving_bench printed no resumed turn"
run "conv1d_test (cpu and emulated cases)" 0 300 bin/conv1d_test --gtest_filter='*Emulated*'
run "gpu_stack_test without HS_REQUIRE_GPUS (skips)" 0 60 bin/gpu_stack_test

echo "== 3. HS_REQUIRE_GPUS=1 without a GPU fails"
run "conv1d_test Gpu cases, HS_REQUIRE_GPUS=1" 1 60 env HS_REQUIRE_GPUS=1 bin/conv1d_test --gtest_filter='*Gpu*'
grep -q 'HS_REQUIRE_GPUS=1 but this machine has 0' "$work/conv1d_test Gpu cases, HS_REQUIRE_GPUS=1.log" ||
  fail "the HS_REQUIRE_GPUS failure does not say why"
run "gpu_stack_test, HS_REQUIRE_GPUS=1" 1 60 env HS_REQUIRE_GPUS=1 bin/gpu_stack_test

if [ $failures -eq 0 ]; then
  echo "bundle check: PASSED"
else
  echo "bundle check: $failures FAILED"
fi
[ $failures -eq 0 ]
