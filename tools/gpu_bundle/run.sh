#!/usr/bin/env bash
# The GPU check of hybridserve, on a lent GPU machine (no Bazel, no network;
# python3 with numpy). Packed into the bundle by tools/gpu_bundle.sh; a copy
# beside gpu_bundle/hs-gpu-bundle.tar.xz first unpacks the bundle (to
# $HS_BUNDLE_DIR, default /tmp/hs-gpu-bundle) and runs the bundle's run.sh:
#
#   OUT=/some/dir gpu_bundle/run.sh
#
# Finds the CUDA libraries the bundle needs (host_sonames.txt) under
# /usr/local/cuda* and in PyTorch's nvidia/*/lib folders, prints what it uses,
# generates the benchmark models with tools/gen_model.py (in the background),
# runs every GPU test case with HS_REQUIRE_GPUS=1 (a GPU case that would skip
# FAILS), then the GPU benchmarks in a quick mode. Steps run in order of
# importance, each bounded by `timeout` (its own budget, and what is left of
# HS_BUDGET_S, default 400 s, for the whole run), so that what matters most
# is done if time runs out. Writes under $OUT: summary.md (one table: test
# outcomes, each figure against its goal), run.log (this script's output) and
# logs.tar.gz (every step's log and gtest XML, the child processes' logs).
# Exit status: 0 when every step passed.
#
# Anchors (issues 44 and 45, item 5), late and optional, each in its own
# budget: mamba_ssm's Triton SSD scan (bench/kernels/ssd_triton_anchor.py) and
# llama.cpp's CUDA backend on the GGUF of the same bench models
# (tools/gpu_bundle/anchors/llamacpp_gpu.sh). They run from the repository
# copy the device command starts in (HS_REPO_DIR, default the folder above
# this script's copy in gpu_bundle/) with the wheels that
# tools/gpu_bundle/anchors/build_wheels.sh wrote to gpu_bundle/anchors
# (HS_ANCHORS_DIR); a wheel not carried skips its anchor with the reason
# (no failure). HS_ANCHORS=0 skips both. The carry, sizes and the second-
# command form (tools/gpu_bundle/anchors/run_anchors.sh) are in
# tools/gpu_bundle/anchors/README.md.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -d "$here/libexec" ]; then
  tarball=$here/hs-gpu-bundle.tar.xz
  [ -f "$tarball" ] || { echo "no bundle: neither $here/libexec nor $tarball" >&2; exit 2; }
  dest=${HS_BUNDLE_DIR:-/tmp/hs-gpu-bundle}
  rm -rf "$dest" && mkdir -p "$dest" || exit 2
  # The anchors' scripts and wheels stay in the repository copy.
  export HS_REPO_DIR=${HS_REPO_DIR:-$(cd "$here/.." && pwd)}
  export HS_ANCHORS_DIR=${HS_ANCHORS_DIR:-$here/anchors}
  echo "unpacking $tarball into $dest"
  if command -v xz >/dev/null; then
    tar -C "$dest" -xJf "$tarball" || exit 2
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$tarball" "$dest" || exit 2
  fi
  # The fixtures (fixtures.txt) come from the repository copy, not the bundle.
  while read -r p; do
    [ -e "$HS_REPO_DIR/$p" ] || { echo "no $HS_REPO_DIR/$p: the tests' fixtures come from the repository copy" >&2; exit 2; }
    mkdir -p "$(dirname "$dest/hs-gpu-bundle/runfiles/hybridserve/$p")"
    ln -sfn "$HS_REPO_DIR/$p" "$dest/hs-gpu-bundle/runfiles/hybridserve/$p"
  done <"$dest/hs-gpu-bundle/fixtures.txt"
  exec "$dest/hs-gpu-bundle/run.sh" "$@"
fi

B=$here
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d /tmp/hs-gpu-run.XXXXXX)
LOGS=$work/logs
MODELS=$work/models
mkdir -p "$LOGS" "$MODELS" "$work/tmp"
STEPS=$LOGS/steps.tsv
: >"$STEPS"
exec > >(tee "$OUT/run.log") 2>&1

budget=${HS_BUDGET_S:-400}
t0=$(date +%s)
deadline=$((t0 + budget))
say() { printf '[%4ds] %s\n' $(($(date +%s) - t0)) "$*"; }

finish() {
  trap - EXIT
  [ -n "${gen_pid:-}" ] && kill -- -"$gen_pid" 2>/dev/null
  python3 "$B/summarize.py" --steps "$STEPS" --logs "$LOGS" --machine "$LOGS/machine.txt" >"$OUT/summary.md" \
    2>"$LOGS/summarize.err" || echo "summarize.py failed: $(cat "$LOGS/summarize.err")"
  cat "$OUT/summary.md"
  # The steps' logs and XML, and what their child processes left in their TEST_TMPDIR.
  tar -C "$work" --exclude='*.safetensors' -czf "$OUT/logs.tar.gz" logs tmp
  say "done: $OUT/summary.md, $OUT/logs.tar.gz"
  exit "$(awk -F'\t' '$3 != 0 { bad = 1 } END { print bad ? 1 : 0 }' "$STEPS")"
}
trap finish EXIT
trap 'say "stopped by a signal"; exit 1' TERM INT

# ---- the machine and its CUDA libraries ----
{
  echo "host: $(uname -srm); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  echo "bundle: $(sed -n 2p "$B/MANIFEST.txt")"
} >"$LOGS/machine.txt"
cat "$LOGS/machine.txt"

cuda_dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
  /usr/local/cuda-*/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$d" ] && cuda_dirs+=("$d")
done
# PyTorch's nvidia-* wheels: nvidia/<package>/lib (cu13: nvidia/cu13/lib).
for p in $(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null); do
  for d in "$p"/*/lib "$p"/*/lib64; do [ -d "$d" ] && cuda_dirs+=("$d"); done
done
# The driver where the loader's cache knows it.
for f in $(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF }'); do cuda_dirs+=("${f%/*}"); done
path=""
missing=0
while read -r soname; do
  found=""
  for d in "${cuda_dirs[@]}"; do
    if [ -e "$d/$soname" ]; then found=$d; break; fi
  done
  if [ -z "$found" ]; then
    say "MISSING $soname (searched: ${cuda_dirs[*]})"
    missing=1
    continue
  fi
  say "cuda library: $soname from $found/$soname -> $(readlink -f "$found/$soname")"
  case ":$path:" in *":$found:"*) ;; *) path=${path:+$path:}$found ;; esac
done <"$B/host_sonames.txt"
export HS_CUDA_LIBRARY_PATH=$path
say "HS_CUDA_LIBRARY_PATH=$HS_CUDA_LIBRARY_PATH"
# What the loader resolves, once, for the record.
"$B/lib/ld-linux-x86-64.so.2" --library-path "$B/lib:$HS_CUDA_LIBRARY_PATH" --list "$B/libexec/decode" \
  >"$LOGS/decode_libraries.txt" 2>&1
grep -E 'cuda|cublas|nccl|not found' "$LOGS/decode_libraries.txt"
[ $missing -eq 0 ] || say "some CUDA libraries are missing: the steps that load them will fail"

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$gpu_name" in
  *H200*) hbm_peak=4800 ;;
  *H100*PCIe*) hbm_peak=2000 ;;
  *H100*) hbm_peak=3350 ;;
  *A100*80GB*) hbm_peak=2039 ;;
  *A100*) hbm_peak=1555 ;;
  *) hbm_peak=3350 ;;
esac
say "GPU: ${gpu_name:-none found}; nominal HBM peak ${hbm_peak} GB/s"

# ---- benchmark models, generated while the tests run ----
# In a process group of its own, which finish() ends (a setsid'd process
# would outlive the device command).
cd "$B" || exit 1
# HS_MODEL_PRESETS (default "bench 1b"): the nemotron_h presets to generate, in bf16.
setsid bash -c '
  for preset in $2; do
    python3 tools/gen_model.py --arch nemotron_h --preset "$preset" --seed 0 --dtype bf16 --out "$1/$preset" &&
      touch "$1/$preset.done" || exit 1
  done' gen_model "$MODELS" "${HS_MODEL_PRESETS:-bench 1b}" >"$LOGS/gen_model.log" 2>&1 &
gen_pid=$!

# ---- steps ----
export HS_REQUIRE_GPUS=1 TEST_SRCDIR=$B/runfiles TEST_WORKSPACE=hybridserve

# step NAME KIND BUDGET_S CMD...: runs CMD (from the bundle's root) under
# `timeout` for BUDGET_S or what is left of the run's budget, whichever is
# less; its output to $LOGS/NAME.log; a line in steps.tsv.
step() {
  local name=$1 kind=$2 limit=$3
  shift 3
  local left=$((deadline - $(date +%s)))
  if [ $left -lt 5 ]; then
    say "SKIPPED $name: the run's budget of ${budget}s is spent"
    printf '%s\t%s\t%s\t%s\n' "$name" "$kind" "budget" 0 >>"$STEPS"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  mkdir -p "$work/tmp/$name"
  local start rc
  start=$(date +%s)
  (cd "$B" && TEST_TMPDIR=$work/tmp/$name timeout -k 10 "$limit" "$@") >"$LOGS/$name.log" 2>&1
  rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && rc=timeout
  printf '%s\t%s\t%s\t%s\n' "$name" "$kind" "$rc" $(($(date +%s) - start)) >>"$STEPS"
  say "$name: $([ "$rc" = 0 ] && echo ok || echo "FAILED ($rc)") in $(($(date +%s) - start))s (limit ${limit}s)"
}
# gtest NAME BUDGET FILTER [ARGS...]
gtest() {
  local name=$1 limit=$2 filter=$3
  shift 3
  step "$name" test "$limit" "bin/$name" "--gtest_filter=$filter" "--gtest_output=xml:$LOGS/$name.xml" "$@"
}
# wait_for FILE BUDGET_S: waits for a model generation to finish.
wait_for() {
  local until=$(($(date +%s) + $2))
  while [ ! -e "$1" ] && kill -0 "$gen_pid" 2>/dev/null && [ "$(date +%s)" -lt "$until" ] &&
    [ "$(date +%s)" -lt $((deadline - 5)) ]; do sleep 1; done
  [ -e "$1" ]
}

GPU_CASES='*Gpu*:CudaBackendCreateTest.*:CudaDeviceCountTest.*'
# 1. The CUDA kernels against the CPU kernels.
for t in ssd_test matmul_test attention_test conv1d_test elementwise_test cuda_backend_test gated_delta_test moe_test \
  rows_test; do
  gtest "$t" 60 "$GPU_CASES"
done
# 2. The engine on the CUDA backend: golden logits, parity, decode graphs, bf16.
gtest model_golden_test 90 '*Gpu*'
gtest model_decode_test 120 '*Gpu*'
gtest model_parity_test 90 '*Gpu*'
gtest model_backend_test 30 'ModelBackendTest.AMissingDevice*'
# 3. The kernels' figures: state update share of HBM, SSD scan tokens/s.
step cuda_kernels_bench bench 90 bin/cuda_kernels_bench --hbm_peak_gbs="$hbm_peak" --reps=3 --calls=10
# 4. The stack on one GPU over TCP and CUDA IPC (the NCCL cases need two GPUs and skip).
gtest gpu_stack_test 180 '*'
gtest nccl_communicator_test 30 '*'
# 5. The CUDA IPC plane against a device copy.
step gpu_transfer_bench bench 45 bin/gpu_transfer_bench --plane=cuda_ipc --reps=5
# 6. Decode's share of the HBM bound, and disaggregated / aggregated TTFT.
if wait_for "$MODELS/bench.done" 120; then
  step throughput_bench bench 120 bin/throughput_bench --device=cuda --bandwidth --model="$MODELS/bench" \
    --prefill=2048 --batches=1,64 --reps=3 --max_tries=4
  step serving_bench bench 150 bin/serving_bench --only=disagg --device=cuda --data_plane=cuda_ipc \
    --model_dir="$MODELS/bench" --reps=1
else
  say "the bench model was not generated in time (see gen_model.log): no throughput or serving figures"
  printf '%s\t%s\t%s\t%s\n' throughput_bench bench no_model 0 serving_bench bench no_model 0 >>"$STEPS"
fi
if wait_for "$MODELS/1b.done" 90; then
  step throughput_bench_1b bench 90 bin/throughput_bench --device=cuda --bandwidth --model="$MODELS/1b" \
    --prefill=8192 --batches=1 --reps=3 --max_tries=4
else
  say "the 1b model was not generated in time: no 1b decode figure"
  printf '%s\t%s\t%s\t%s\n' throughput_bench_1b bench no_model 0 >>"$STEPS"
fi

# 7. Anchors, optional (see the header): each skipped with its reason when
# what it needs is not here; a skip is not a failure.
anchor_skip() {
  say "SKIPPED $1: $2"
  echo "SKIP: $2" >"$LOGS/$1.log"
  printf '%s\t%s\t%s\t%s\n' "$1" anchor 0 0 >>"$STEPS"
}
repo=${HS_REPO_DIR:-}
anchors=${HS_ANCHORS_DIR:-}
if [ "${HS_ANCHORS:-1}" = 0 ]; then
  anchor_skip ssd_triton_anchor "HS_ANCHORS=0"
  anchor_skip llamacpp_cuda "HS_ANCHORS=0"
  anchor_skip gdn_fla_anchor "HS_ANCHORS=0"
elif [ -z "$repo" ] || [ ! -f "$repo/bench/kernels/ssd_triton_anchor.py" ]; then
  anchor_skip ssd_triton_anchor "no repository copy with bench/kernels/ssd_triton_anchor.py (HS_REPO_DIR=${repo:-unset})"
  anchor_skip llamacpp_cuda "no repository copy (HS_REPO_DIR=${repo:-unset})"
  anchor_skip gdn_fla_anchor "no repository copy (HS_REPO_DIR=${repo:-unset})"
else
  mamba_whl=$(ls "$anchors"/mamba_ssm-*.whl 2>/dev/null | head -1)
  if [ -z "$mamba_whl" ]; then
    anchor_skip ssd_triton_anchor "no mamba_ssm wheel in ${anchors:-HS_ANCHORS_DIR unset} (build_wheels.sh mamba)"
  elif [ $((deadline - $(date +%s))) -lt 60 ]; then
    anchor_skip ssd_triton_anchor "under 60 s of the run's budget left"
  else
    # Triton compiles and autotunes each kernel once per shape (most of the time).
    step ssd_triton_anchor anchor 150 python3 "$repo/bench/kernels/ssd_triton_anchor.py" --mamba "$mamba_whl" \
      --rep-ms 100
  fi
  if [ -z "$(ls "$anchors"/llama_cpp_python-*.whl "$anchors"/llama_cpp_python-*-site.tar.xz 2>/dev/null)" ]; then
    anchor_skip llamacpp_cuda "no llama-cpp-python CUDA wheel in ${anchors:-HS_ANCHORS_DIR unset} (build_wheels.sh llamacpp)"
  elif [ $((deadline - $(date +%s))) -lt 90 ]; then
    anchor_skip llamacpp_cuda "under 90 s of the run's budget left"
  else
    # The models run.sh generated (bench, 1b; generated there if missing).
    wait_for "$MODELS/1b.done" 60 || true
    step llamacpp_cuda anchor 240 bash -c 'cd "$1" && shift && exec tools/gpu_bundle/anchors/llamacpp_gpu.sh "$@"' \
      llamacpp_gpu "$repo" "$anchors" "$MODELS" ${HS_MODEL_PRESETS:-bench 1b}
  fi
  # Issue 50's: our CUDA GatedDeltaPrefill against fla's chunk_gated_delta_rule.
  if [ -z "$(ls "$anchors"/flash_linear_attention-*.whl 2>/dev/null)" ]; then
    anchor_skip gdn_fla_anchor "no flash-linear-attention wheel in ${anchors:-HS_ANCHORS_DIR unset} (build_wheels.sh fla)"
  elif [ $((deadline - $(date +%s))) -lt 60 ]; then
    anchor_skip gdn_fla_anchor "under 60 s of the run's budget left"
  else
    step gdn_fla_anchor anchor 120 python3 "$repo/bench/kernels/gdn_fla_anchor.py" --fla-wheels "$anchors" \
      --ours "$B/bin/gdn_cuda_bench" --out "$LOGS/gdn_fla_anchor.json"
  fi
fi
