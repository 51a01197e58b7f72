#!/usr/bin/env bash
# llama.cpp's CUDA backend on the GPU machine, on the same GGUF our bench
# models convert to (issue 44 item 5, issue 45 item 5). Run from the
# repository root (the device machine's copy of the working tree):
#
#   tools/gpu_bundle/anchors/llamacpp_gpu.sh ANCHORS_DIR MODELS_DIR [PRESET...]   (default: bench 1b)
#
# ANCHORS_DIR holds what tools/gpu_bundle/anchors/build_wheels.sh wrote:
# llama_cpp_python-0.3.36-*.whl (CUDA, sm_90; or llama_cpp_python-0.3.36-
# site.tar.xz, the same unpacked, where the wheel is too big), diskcache-*.whl and
# llcpp-convert-0.3.36.tar.xz. MODELS_DIR/PRESET is a nemotron_h model that
# tools/gen_model.py wrote in bf16 (run.sh generates bench and 1b there);
# a missing one is generated here (--seed 0 --dtype bf16, as run.sh does).
# For each preset: convert it with bench/llamacpp/convert.py (--outtype bf16,
# the same bits as our weights), then bench/llamacpp/run_llamacpp_bench.py
# with every layer on the GPU: prefill LLCPP_PREFILL (default 2048,8192),
# decode batches LLCPP_BATCHES (default 1,8,64), 128 tokens of context and 64
# steps as our throughput_bench. Prints `LLAMACPP_JSON PRESET {...}` per preset
# (the bundle's summarize.py reads these lines).
#
# The wheel is unpacked to a temp dir (no pip, no network); libggml-cuda needs
# libcudart/libcublas of CUDA 13: HS_CUDA_LIBRARY_PATH (run.sh exports it) or
# /usr/local/cuda*/lib64 and PyTorch's nvidia/*/lib. Exits 0 with `SKIP: ...`
# when the wheel is not carried or there is no GPU; 1 when a preset failed.
set -uo pipefail

anchors=${1:?usage: llamacpp_gpu.sh ANCHORS_DIR MODELS_DIR [PRESET...]}
models=${2:?usage: llamacpp_gpu.sh ANCHORS_DIR MODELS_DIR [PRESET...]}
shift 2
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(bench 1b)
PY=${PYTHON:-python3}

# The wheel, or the same unpacked and xz-packed (build_wheels.sh does that to a wheel over 48 MiB).
whl=$(ls "$anchors"/llama_cpp_python-0.3.36-*.whl "$anchors"/llama_cpp_python-0.3.36-site.tar.xz 2>/dev/null | head -1)
[ -n "$whl" ] || { echo "SKIP: no llama-cpp-python CUDA wheel in $anchors (tools/gpu_bundle/anchors/build_wheels.sh llamacpp)"; exit 0; }
conv=$anchors/llcpp-convert-0.3.36.tar.xz
[ -f "$conv" ] || { echo "SKIP: no $conv (tools/gpu_bundle/anchors/build_wheels.sh converter)"; exit 0; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU (nvidia-smi -L failed)"; exit 0; }

work=$(mktemp -d /tmp/hs-llcpp-gpu.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/site" "$work/gguf"
case $whl in *.tar.xz) tar -C "$work/site" -xJf "$whl" || { echo "cannot unpack $whl"; exit 1; } ;; esac
for w in "$whl" "$anchors"/diskcache-*.whl; do
  [ "${w%.whl}" != "$w" ] || continue
  [ -f "$w" ] && "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$work/site"
done
tar -C "$work" -xJf "$conv" || { echo "cannot unpack $conv"; exit 1; }

if [ -z "${HS_CUDA_LIBRARY_PATH:-}" ]; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 \
    $("$PY" -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null); do
    [ -d "$d" ] && HS_CUDA_LIBRARY_PATH=${HS_CUDA_LIBRARY_PATH:+$HS_CUDA_LIBRARY_PATH:}$d
  done
fi
export LD_LIBRARY_PATH=${HS_CUDA_LIBRARY_PATH:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
echo "llama-cpp-python: $whl ($(du -k "$whl" | cut -f1) KiB); LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
lib=$(ls "$work"/site/llama_cpp/lib/libggml-cuda.so* 2>/dev/null | head -1)
[ -n "$lib" ] || { echo "FAILED: the wheel has no libggml-cuda (a CPU build?)"; exit 1; }
ldd "$lib" | grep -E 'cuda|cublas|not found'
"$PY" -c 'import llama_cpp, sys; ok = llama_cpp.llama_supports_gpu_offload(); print("llama_cpp", llama_cpp.__version__, "GPU offload:", ok); sys.exit(0 if ok else 1)' ||
  { echo "FAILED: llama_cpp does not load or has no GPU offload"; exit 1; }

rc=0
for p in "${presets[@]}"; do
  src=$models/$p
  if [ ! -f "$src/model.safetensors" ] && [ ! -f "$src/model.safetensors.index.json" ]; then
    echo "== generating $p (bf16)"
    "$PY" tools/gen_model.py --arch nemotron_h --preset "$p" --seed 0 --dtype bf16 --out "$src" ||
      { echo "FAILED: gen_model $p"; rc=1; continue; }
  fi
  gguf=$work/gguf/$p-bf16.gguf
  echo "== converting $src -> $gguf"
  t=$(date +%s)
  "$PY" bench/llamacpp/convert.py --llama-cpp-dir "$work/llama.cpp" "$src" --outtype bf16 --outfile "$gguf" \
    >"$work/convert-$p.log" 2>&1 || { tail -20 "$work/convert-$p.log"; echo "FAILED: convert $p"; rc=1; continue; }
  echo "converted in $(($(date +%s) - t)) s: $(du -m "$gguf" | cut -f1) MiB"
  echo "== llama.cpp CUDA: $p"
  line=$("$PY" bench/llamacpp/run_llamacpp_bench.py --gguf "$gguf" --n-gpu-layers -1 --threads "${LLCPP_THREADS:-8}" \
    --prefill "${LLCPP_PREFILL:-2048,8192}" --batches "${LLCPP_BATCHES:-1,8,64}" --decode-context 128 \
    --decode-steps 64 --reps 3 --max-tries 4 --max-other-cpu 1e9 --label "llamacpp-cuda-$p" | tail -1)
  if [ -n "$line" ] && [ "${line:0:1}" = "{" ]; then
    echo "LLAMACPP_JSON $p $line"
  else
    echo "FAILED: run_llamacpp_bench $p"
    rc=1
  fi
done
exit $rc
