#!/usr/bin/env bash
# Reproduce the GGUF conversion of the bench models for the llama.cpp baseline.
#
#   bench/llamacpp/convert.sh [OUT_DIR]          (default OUT_DIR=/tmp/hs-bench)
#
# 1. Generates the bench models with tools/gen_model.py (seed 0, fp32) unless
#    OUT_DIR/nemotron_h and OUT_DIR/mamba2 already hold config.json + model.safetensors.
# 2. Gets llama.cpp's converter: $LLAMA_CPP_DIR if set, else the vendor/llama.cpp tree of the
#    llama-cpp-python sdist (pip download, extracted under $LLAMA_CPP_SRC, default
#    /tmp/llcpp). Nothing from llama.cpp is copied into this repository.
# 3. Runs bench/llamacpp/convert.py (the converter plus two in-memory tweaks, see that file)
#    to write OUT_DIR/gguf/{nemotron_h,mamba2}-{f32,bf16}.gguf.
#
# Needs: python3 with torch, transformers, numpy, safetensors (tools/requirements.txt) and
# the converter's own light deps (sentencepiece/protobuf are not needed for these models).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-/tmp/hs-bench}"
LLAMA_CPP_PY_VERSION="${LLAMA_CPP_PY_VERSION:-0.3.36}"
LLAMA_CPP_SRC="${LLAMA_CPP_SRC:-/tmp/llcpp}"
ARCHS="${ARCHS:-nemotron_h mamba2}"
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

mkdir -p "$OUT/gguf"
for arch in $ARCHS; do
  if [[ ! -f "$OUT/$arch/model.safetensors" ]]; then
    python3 "$REPO/tools/gen_model.py" --preset bench --seed 0 --arch "$arch" --out "$OUT/$arch"
  fi
  for t in $OUTTYPES; do
    dst="$OUT/gguf/$arch-$t.gguf"
    echo "== $arch $t -> $dst"
    python3 "$REPO/bench/llamacpp/convert.py" --llama-cpp-dir "$LLAMA_CPP_DIR" \
      "$OUT/$arch" --outtype "$t" --outfile "$dst" > "$OUT/gguf/convert-$arch-$t.log" 2>&1 \
      || { tail -30 "$OUT/gguf/convert-$arch-$t.log"; exit 1; }
    tail -1 "$OUT/gguf/convert-$arch-$t.log"
  done
done
ls -l "$OUT/gguf"/*.gguf
