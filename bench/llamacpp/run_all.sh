#!/usr/bin/env bash
# Run the llama.cpp baseline alone on every GGUF written by convert.sh (the comparison with
# hybridserve under the same rules is bench/engine/compare_llamacpp.py; use this for llama.cpp
# by itself, e.g. flash attention on vs off).
#
#   bench/llamacpp/run_all.sh [OUT_DIR] [extra run_llamacpp_bench.py args...]
#   e.g. bench/llamacpp/run_all.sh /tmp/hs-bench --prefill 512,2048 --batches 1,8
#
# Appends one JSON line per (model, dtype, flash-attn) to OUT_DIR/llamacpp_results.jsonl.
# Token ids: --tokens FILE if given in the extra args, else seeded random ids.
# Flash attention only matters for nemotron_h (mamba2 has no attention layers).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/hs-bench}"
shift || true
RESULTS="$OUT/llamacpp_results.jsonl"
for g in "$OUT"/gguf/nemotron_h-f32.gguf "$OUT"/gguf/nemotron_h-bf16.gguf \
         "$OUT"/gguf/mamba2-f32.gguf "$OUT"/gguf/mamba2-bf16.gguf; do
  [[ -f "$g" ]] || { echo "missing $g (run convert.sh)"; continue; }
  fas="on"
  [[ "$(basename "$g")" == nemotron_h-* ]] && fas="on off"
  for fa in $fas; do
    echo "== $(basename "$g") flash_attn=$fa"
    python3 "$REPO/bench/llamacpp/run_llamacpp_bench.py" --gguf "$g" --flash-attn "$fa" \
      --label "$(basename "$g" .gguf)-fa_$fa" --out "$RESULTS" "$@" > /dev/null
  done
done
echo "results: $RESULTS"
