#!/usr/bin/env bash
# The anchors alone, as a second command on the same warm GPU machine, for
# when their wheels do not fit in one carry beside the bundle (see README.md
# here). Run from the repository root:
#
#   OUT=$OUT tools/gpu_bundle/anchors/run_anchors.sh
#
# Uses the wheels in HS_ANCHORS_DIR (default gpu_bundle/anchors). When the
# bundle's run.sh ran before on this machine, its newest work dir
# (/tmp/hs-gpu-run.*, or HS_RUN_DIR) gives the generated models and our
# figures (cuda_kernels_bench, throughput_bench*), so the table has the ratios;
# otherwise the models are generated here and only the anchors' figures show.
# Steps: ssd_triton_anchor (HS_SSD_BUDGET_S, default 150 s), llamacpp_cuda
# (HS_LLCPP_BUDGET_S, default 300 s). Writes $OUT/anchors_summary.md (the
# bundle's summarize.py) and $OUT/anchors_logs.tar.gz; prints the summary.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$repo" || exit 2
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
anchors=${HS_ANCHORS_DIR:-$repo/gpu_bundle/anchors}
work=$(mktemp -d /tmp/hs-anchors-run.XXXXXX)
LOGS=$work/logs
STEPS=$LOGS/steps.tsv
mkdir -p "$LOGS"
: >"$STEPS"
t0=$(date +%s)
say() { printf '[%4ds] %s\n' $(($(date +%s) - t0)) "$*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' |
  tee "$LOGS/machine.txt"

run_dir=${HS_RUN_DIR:-$(ls -dt /tmp/hs-gpu-run.* 2>/dev/null | head -1)}
models=$work/models
if [ -n "$run_dir" ] && [ -d "$run_dir/logs" ]; then
  say "our figures and models from $run_dir"
  for s in cuda_kernels_bench throughput_bench throughput_bench_1b; do
    if [ -f "$run_dir/logs/$s.log" ]; then
      cp "$run_dir/logs/$s.log" "$LOGS/"
      printf '%s\t%s\t%s\t%s\n' "$s" bench 0 0 >>"$STEPS"
    fi
  done
  [ -d "$run_dir/models" ] && models=$run_dir/models
fi
mkdir -p "$models"

step() {
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && rc=timeout
  printf '%s\t%s\t%s\t%s\n' "$name" anchor "$rc" $(($(date +%s) - start)) >>"$STEPS"
  say "$name: $([ "$rc" = 0 ] && echo ok || echo "FAILED ($rc)") in $(($(date +%s) - start))s (limit ${limit}s)"
  tail -3 "$LOGS/$name.log"
}

mamba_whl=$(ls "$anchors"/mamba_ssm-*.whl 2>/dev/null | head -1)
if [ -n "$mamba_whl" ]; then
  step ssd_triton_anchor "${HS_SSD_BUDGET_S:-150}" python3 bench/kernels/ssd_triton_anchor.py --mamba "$mamba_whl" \
    --rep-ms 100
else
  echo "SKIP: no mamba_ssm wheel in $anchors (build_wheels.sh mamba)" >"$LOGS/ssd_triton_anchor.log"
  printf '%s\t%s\t%s\t%s\n' ssd_triton_anchor anchor 0 0 >>"$STEPS"
fi
step llamacpp_cuda "${HS_LLCPP_BUDGET_S:-300}" tools/gpu_bundle/anchors/llamacpp_gpu.sh "$anchors" "$models" \
  ${HS_MODEL_PRESETS:-bench 1b}

python3 tools/gpu_bundle/summarize.py --steps "$STEPS" --logs "$LOGS" --machine "$LOGS/machine.txt" \
  >"$OUT/anchors_summary.md" || echo "summarize.py failed"
tar -C "$work" -czf "$OUT/anchors_logs.tar.gz" logs
cat "$OUT/anchors_summary.md"
say "done: $OUT/anchors_summary.md, $OUT/anchors_logs.tar.gz"
awk -F'\t' '$3 != 0 { bad = 1 } END { exit bad ? 1 : 0 }' "$STEPS"
