#!/usr/bin/env bash
# Reproduce the GGUF conversion of the bench models for the llama.cpp baseline.
#
#   bench/llamacpp/convert.sh [OUT_DIR]          (default OUT_DIR=/tmp/hs-bench)
#
# 1. Generates the bench models with tools/gen_model.py (seed 0) unless they already exist:
#    fp32 in OUT_DIR/MODEL and bf16 in OUT_DIR/MODEL-bf16 for every MODEL of $ARCHS
#    (default: nemotron_h mamba2 bamba granitemoehybrid; nemotron_h_moe is
#    `gen_model.py --arch nemotron_h --preset moe_bench`; qwen3_5 is `--arch qwen3_5_text --preset bench`;
#    see gen_args below; ARCHS="qwen3_5 qwen3_5_moe" for the Gated DeltaNet hybrids of issue 50).
#    hybridserve reads these directories directly.
# 2. Gets llama.cpp's converter: $LLAMA_CPP_DIR if set, else the vendor/llama.cpp tree of the
#    llama-cpp-python sdist (pip download, extracted under $LLAMA_CPP_SRC, default
#    /tmp/llcpp). Nothing from llama.cpp is copied into this repository.
# 3. Runs bench/llamacpp/convert.py (the converter plus in-memory tweaks, see that file)
#    to write OUT_DIR/gguf/MODEL-{f32,bf16}.gguf: f32 from the fp32 directory
#    (--outtype f32), bf16 from the *bf16 directory* (--outtype bf16), so that both engines
#    read bit-identical bf16 weights ("same weights converted once": bf16 -> bf16 is a copy,
#    the 1-D tensors llama.cpp keeps in F32 are exact widenings of the bf16 values).
#
# Needs: python3 with torch, transformers, numpy, safetensors (tools/requirements.txt) and
# the converter's own light deps (sentencepiece/protobuf are not needed for these models).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/hs-bench}"
LLAMA_CPP_PY_VERSION="${LLAMA_CPP_PY_VERSION:-0.3.36}"
LLAMA_CPP_SRC="${LLAMA_CPP_SRC:-/tmp/llcpp}"
# Model names (directory and GGUF names; compare_llamacpp.py MODELS uses the same ones).
ARCHS="${ARCHS:-nemotron_h mamba2 bamba granitemoehybrid}"
OUTTYPES="${OUTTYPES:-f32 bf16}"

if [[ -z "${LLAMA_CPP_DIR:-}" ]]; then
  LLAMA_CPP_DIR="$LLAMA_CPP_SRC/llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp"
  if [[ ! -f "$LLAMA_CPP_DIR/convert_hf_to_gguf.py" ]]; then
    mkdir -p "$LLAMA_CPP_SRC"
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PY_VERSION" -d "$LLAMA_CPP_SRC"
    tar -xzf "$LLAMA_CPP_SRC/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz" -C "$LLAMA_CPP_SRC"
  fi
fi
echo "converter: $LLAMA_CPP_DIR/convert_hf_to_gguf.py"

# tools/gen_model.py arguments of a model name.
gen_args() {
  case "$1" in
    nemotron_h_moe) echo "--arch nemotron_h --preset moe_bench" ;;
    qwen3_5)        echo "--arch qwen3_5_text --preset bench" ;;
    *)              echo "--arch $1 --preset bench" ;;
  esac
}

# Extra convert_hf_to_gguf.py arguments of a model name (the Qwen converters expect MTP tensors
# unless told --no-mtp; our models, like transformers' classes, have none).
convert_args() {
  case "$1" in
    qwen3_next|qwen3_5|qwen3_5_moe) echo "--no-mtp" ;;
    *)                              echo "" ;;
  esac
}

mkdir -p "$OUT/gguf"
for arch in $ARCHS; do
  for t in $OUTTYPES; do
    case "$t" in
      f32)  src="$OUT/$arch";      gen_dtype=fp32 ;;
      bf16) src="$OUT/$arch-bf16"; gen_dtype=bf16 ;;
      *) echo "unsupported OUTTYPE $t (f32, bf16)"; exit 1 ;;
    esac
    if [[ ! -f "$src/model.safetensors" ]]; then
      # shellcheck disable=SC2046
      python3 "$REPO/tools/gen_model.py" $(gen_args "$arch") --seed 0 --dtype "$gen_dtype" --out "$src"
    fi
    dst="$OUT/gguf/$arch-$t.gguf"
    echo "== $src ($t) -> $dst"
    # shellcheck disable=SC2046
    python3 "$REPO/bench/llamacpp/convert.py" --llama-cpp-dir "$LLAMA_CPP_DIR" \
      "$src" --outtype "$t" --outfile "$dst" $(convert_args "$arch") > "$OUT/gguf/convert-$arch-$t.log" 2>&1 \
      || { tail -30 "$OUT/gguf/convert-$arch-$t.log"; exit 1; }
    tail -1 "$OUT/gguf/convert-$arch-$t.log"
  done
done
ls -l "$OUT/gguf"/*.gguf
