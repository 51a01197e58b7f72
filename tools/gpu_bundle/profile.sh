#!/usr/bin/env bash
# Where the GPU time goes, after run.sh on a lent GPU machine: Nsight Compute
# (ncu, in the device image) over the bundle's benchmarks. Not a test: what it
# writes under $OUT tells the next piece of GPU work what to speed up.
#
#   OUT=/some/dir /tmp/hs-gpu-bundle/hs-gpu-bundle/profile.sh [MODEL_DIR]
#
# Reads the CUDA library path from $OUT/run.log (or HS_CUDA_LIBRARY_PATH).
# MODEL_DIR defaults to the bench model run.sh generated (/tmp/hs-gpu-run.*/models/bench).
# Writes $OUT/profile.md and $OUT/profile.tar.gz (the raw files):
#   1. decode_kernels_<mode>.csv: each kernel of the bench model's decode steps at
#      batch 1 (deterministic and fast matmul), its duration
#      (gpu__time_duration.sum) with the GPU serialised: the sum per step
#      against the step's wall time says whether kernels or the gaps between
#      them dominate;
#   2. ssd_ncu.txt, attention_decode_ncu.txt: speed of light, occupancy,
#      launch statistics, memory and warp-state sections of the chunk scan,
#      the selective state update and decode attention;
#   3. profile.md: the decode kernels grouped by name (count, total, share).
# Each part is bounded by `timeout`; a part that fails leaves its log.
# HS_PROFILE_PARTS (default "1 2") picks the parts.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=$here
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
P=$(mktemp -d /tmp/hs-gpu-profile.XXXXXX)/profile  # packed into $OUT/profile.tar.gz at the end
mkdir -p "$P"
# The CUDA libraries' folders, as run.sh found them (its run.log says).
[ -n "${HS_CUDA_LIBRARY_PATH:-}" ] || HS_CUDA_LIBRARY_PATH=$(sed -n 's/.*HS_CUDA_LIBRARY_PATH=//p' "$OUT/run.log" 2>/dev/null | head -1)
export HS_CUDA_LIBRARY_PATH
model=${1:-$(ls -d /tmp/hs-gpu-run.*/models/bench 2>/dev/null | head -1)}
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
t0=$(date +%s)
say() { printf '[profile %4ds] %s\n' $(($(date +%s) - t0)) "$*"; }
[ -n "$ncu_bin" ] || { say "no ncu on this machine"; exit 1; }
[ -d "$model" ] || { say "no model (run run.sh first or name one)"; exit 1; }
say "ncu: $ncu_bin ($("$ncu_bin" --version 2>&1 | tail -1)); model $model"
cd "$B" || exit 1

parts=${HS_PROFILE_PARTS:-1 2}  # which of the parts below run
# 1. The decode step, kernel by kernel. 64 timed steps follow a warm-up; the
# first 400 launches (load, the context's prefill, warm-up) are skipped.
[[ " $parts " == *" 1 "* ]] && for mode in deterministic fast; do
  timeout -k 5 80 "$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
    --launch-skip 400 --launch-count 600 --log-file "$P/decode_kernels_$mode.csv" \
    bin/throughput_bench --device=cuda --model="$model" --mode="$mode" --prefill= --batches=1 --reps=1 \
    --max_tries=1 --decode_steps=64 >"$P/decode_ncu_$mode.log" 2>&1
  say "decode kernels ($mode): exit $? ($(wc -l <"$P/decode_kernels_$mode.csv" 2>/dev/null || echo 0) lines)"
done

# 2. Stall reasons and limits of the kernels the figures single out: the chunk
# scan (one launch), the selective state update (batch 1 and 2), decode
# attention (one launch in a decode step of the bench model).
if [[ " $parts " == *" 2 "* ]]; then
  sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis
    --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats)
  for kernel in ChunkScan StateUpdate; do
    timeout -k 5 60 "$ncu_bin" --clock-control none -k "regex:$kernel" --launch-count 2 "${sections[@]}" \
      bin/cuda_kernels_bench --hbm_peak_gbs=4800 --reps=1 --calls=1 >>"$P/ssd_ncu.txt" 2>&1
    say "$kernel: exit $?"
  done
  timeout -k 5 60 "$ncu_bin" --clock-control none -k 'regex:AttentionDecode' --launch-skip 20 --launch-count 1 \
    "${sections[@]}" bin/throughput_bench --device=cuda --model="$model" --prefill= --batches=1 --reps=1 \
    --max_tries=1 --decode_steps=16 >"$P/attention_decode_ncu.txt" 2>&1
  say "decode attention: exit $?"
fi

# 3. The decode kernels grouped by name.
python3 - "$P" >"$OUT/profile.md" <<'EOF'
import collections, csv, glob, os, re, sys
out = sys.argv[1]
for path in sorted(glob.glob(os.path.join(out, "decode_kernels_*.csv"))):
    rows = []
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    reader = csv.DictReader(lines)
    scale = 1.0  # to ns; the row after the header gives the unit
    for r in reader:
        v = r.get("gpu__time_duration.sum", "")
        if not r.get("Kernel Name"):
            scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(v, scale)
            continue
        try:
            rows.append((r["Kernel Name"], float(v.replace(",", "")) * scale))
        except (KeyError, ValueError):
            continue
    total = sum(t for _, t in rows)
    by = collections.defaultdict(lambda: [0, 0.0])
    for name, t in rows:
        short = re.sub(r"\(anonymous namespace\)::|<?unnamed>::|[A-Za-z_]\w*::", "", name).removeprefix("void ")
        short = short.split("(")[0]
        by[short][0] += 1
        by[short][1] += t
    print(f"## {os.path.basename(path)}: {len(rows)} kernels, {total / 1e3:.1f} us in all "
          f"(GPU serialised)\n")
    print("| kernel | launches | total us | share | mean us |")
    print("| --- | --- | --- | --- | --- |")
    for name, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {n} | {t / 1e3:.1f} | {t / total:.1%} | {t / n / 1e3:.2f} |")
    print()
EOF
cp "$OUT/profile.md" "$P/"
tar -C "${P%/profile}" -czf "$OUT/profile.tar.gz" profile
say "done: $OUT/profile.md, $OUT/profile.tar.gz"
