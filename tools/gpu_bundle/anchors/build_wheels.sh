#!/usr/bin/env bash
# Builds, on this (CPU) machine, the wheels the GPU run's anchors carry.
# Nothing of mamba_ssm or llama.cpp enters the repository: the wheels go to
# OUT (default gpu_bundle/anchors, ignored by git like the bundle).
#
#   tools/gpu_bundle/anchors/build_wheels.sh [mamba] [converter] [llamacpp]   (default: all three)
#
# mamba: mamba-ssm 2.3.2.post1 from its PyPI sdist, pure Python
#   (MAMBA_SKIP_CUDA_BUILD=TRUE: no selective_scan_cuda / causal_conv1d
#   extension), ~211 KB. Needs torch importable (PYTHON, default
#   /work/venv-golden/bin/python); the GPU machine has torch, triton, einops.
#   bench/kernels/ssd_triton_anchor.py imports its Triton SSD scan without the
#   package __init__ (which imports the CUDA extension).
# llamacpp: llama-cpp-python 0.3.36 from its sdist (LLCPP_SDIST, else pip
#   download), CUDA on for sm_90 (nvcc from CUDA_HOME, default /usr/local/cuda),
#   shared libraries stripped. mtmd (LLAVA_BUILD) and the tools are off: the
#   runner needs libllama + ggml only. The CUDA backend links libcudart and
#   libcublas dynamically: the GPU machine's CUDA (or PyTorch's nvidia-* wheels)
#   provides them; llamacpp_gpu.sh puts them on LD_LIBRARY_PATH.
# converter: what the GPU machine needs besides the wheel to convert the
#   bench models it generates into GGUF there (a bf16 GGUF of the 0.93B model
#   is ~1.9 GB, far over a carry): llama.cpp's convert_hf_to_gguf.py,
#   conversion/, gguf-py/ and models/ggml-vocab-gpt-neox.gguf from the same
#   sdist (llcpp-convert-0.3.36.tar.xz, ~1 MB), and the diskcache wheel
#   llama_cpp's package imports (pure Python).
#   Compiling ggml-cuda takes hours on 2 cores: run it under nice in the
#   background (NICE, default 19) with JOBS (default 2) compile jobs.
#
# Carry (see tools/gpu_bundle/anchors/README.md): the wheels, 64 MiB per call
# together with everything else carried.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
OUT=${OUT:-$repo/gpu_bundle/anchors}
PYTHON=${PYTHON:-/work/venv-golden/bin/python}
WORK=${WORK:-/tmp/hs-anchors-build}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
what=("$@")
[ ${#what[@]} -gt 0 ] || what=(mamba converter llamacpp)

build_mamba() {
  echo "== mamba-ssm 2.3.2.post1 (pure Python, no CUDA extension)"
  rm -f "$OUT"/mamba_ssm-*.whl
  # Its setup.py imports `wheel` (and torch): without build isolation the
  # interpreter must have both. A venv without `wheel` gets the system's, alone.
  local shim=""
  if ! "$PYTHON" -c 'import wheel' 2>/dev/null; then
    shim=$WORK/wheel-shim
    mkdir -p "$shim"
    ln -sfn "$(/usr/bin/python3 -c 'import os, wheel; print(os.path.dirname(wheel.__file__))')" "$shim/wheel"
  fi
  PYTHONPATH=$shim${PYTHONPATH:+:$PYTHONPATH} MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE \
    "$PYTHON" -m pip wheel --no-deps --no-build-isolation -w "$OUT" mamba-ssm==2.3.2.post1
  local whl
  whl=$(ls "$OUT"/mamba_ssm-2.3.2.post1-*.whl)
  # The Triton SSD scan must be in it, and no compiled extension.
  "$PYTHON" - "$whl" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = "mamba_ssm/ops/triton/ssd_combined.py"
assert need in names, f"{need} missing from {sys.argv[1]}"
so = [n for n in names if n.endswith(".so")]
assert not so, f"compiled extensions in the wheel: {so}"
print(f"{sys.argv[1]}: {len(names)} files, has {need}, no .so")
PY
  ls -l "$whl"
}

# Strips the built wheel's shared libraries and repacks it into OUT; a wheel
# over LLCPP_MAX_MIB (default 48: the carry is 64 MiB with everything else)
# goes as llama_cpp_python-0.3.36-site.tar.xz instead (xz packs the CUDA
# fatbins tighter than the wheel's deflate); llamacpp_gpu.sh takes either.
# `build_wheels.sh llamacpp-package` redoes this from $WORK/llcpp-cuda.
package_llamacpp() {
  local whl
  whl=$(ls "$WORK"/llcpp-cuda/llama_cpp_python-0.3.36-*.whl)
  echo "built: $(ls -l "$whl")"
  # Strip the shared libraries (debug sections and symbols the loader does
  # not need) and repack.
  rm -rf "$WORK/llcpp-strip" && mkdir -p "$WORK/llcpp-strip"
  /usr/bin/python3 -m wheel unpack -d "$WORK/llcpp-strip" "$whl"
  find "$WORK/llcpp-strip" -name '*.so*' -type f -exec strip --strip-unneeded {} +
  ls -l "$WORK"/llcpp-strip/*/llama_cpp/lib/
  rm -f "$OUT"/llama_cpp_python-*.whl
  /usr/bin/python3 -m wheel pack -d "$OUT" "$WORK"/llcpp-strip/llama_cpp_python-0.3.36
  rm -f "$OUT"/llama_cpp_python-0.3.36-site.tar.xz
  local packed size
  packed=$(ls "$OUT"/llama_cpp_python-*.whl)
  size=$(stat -c %s "$packed")
  if [ "$size" -gt $((${LLCPP_MAX_MIB:-48} << 20)) ]; then
    echo "$packed is $((size >> 20)) MiB: packing the unpacked wheel with xz instead"
    tar -C "$WORK"/llcpp-strip/llama_cpp_python-0.3.36 -cJf "$OUT/llama_cpp_python-0.3.36-site.tar.xz" .
    rm -f "$packed"
  fi
  ls -l "$OUT"/llama_cpp_python-*
  # Which CUDA libraries the GPU machine must provide.
  find "$WORK/llcpp-strip" -name 'libggml-cuda*.so*' -type f -exec sh -c 'readelf -d "$1" | grep NEEDED' _ {} \;
}

build_llamacpp() {
  echo "== llama-cpp-python 0.3.36, CUDA sm_90"
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  [ -x "$cuda/bin/nvcc" ] || { echo "no nvcc at $cuda/bin/nvcc" >&2; return 1; }
  "$cuda/bin/nvcc" --version | tail -1
  local sdist
  sdist=$(llcpp_sdist)
  rm -rf "$WORK/llcpp-cuda" && mkdir -p "$WORK/llcpp-cuda"
  # -DLLAVA_BUILD=OFF: no mtmd. GGML_NATIVE=OFF: the host part must run on
  # the GPU machine's CPU, not only this one's. CMAKE_CUDA_ARCHITECTURES=90:
  # H100/H200 only (one arch: a fraction of the default build).
  CUDACXX=$cuda/bin/nvcc CUDA_HOME=$cuda PATH=$cuda/bin:$PATH \
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DGGML_OPENMP=ON \
-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
-DCMAKE_CUDA_COMPILER=$cuda/bin/nvcc" \
    CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2} \
    nice -n "${NICE:-19}" "$PYTHON" -m pip wheel -v --no-deps \
      -w "$WORK/llcpp-cuda" "$sdist"
  package_llamacpp
}

llcpp_sdist() {
  local sdist=${LLCPP_SDIST:-}
  if [ -z "$sdist" ]; then
    sdist=$WORK/llama_cpp_python-0.3.36.tar.gz
    [ -f "$sdist" ] || "$PYTHON" -m pip download --no-deps --no-binary :all: -d "$WORK" llama-cpp-python==0.3.36 >&2
  fi
  echo "$sdist"
}

build_converter() {
  echo "== llama.cpp's converter (from the llama-cpp-python 0.3.36 sdist) and diskcache"
  local sdist top=llama_cpp_python-0.3.36/vendor/llama.cpp
  sdist=$(llcpp_sdist)
  rm -rf "$WORK/conv" && mkdir -p "$WORK/conv"
  tar -C "$WORK/conv" -xzf "$sdist" "$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py" \
    "$top/models/ggml-vocab-gpt-neox.gguf"
  # Stored as llama.cpp/...: convert.py --llama-cpp-dir DIR/llama.cpp.
  tar -C "$WORK/conv/llama_cpp_python-0.3.36/vendor" -cJf "$OUT/llcpp-convert-0.3.36.tar.xz" llama.cpp
  rm -f "$OUT"/diskcache-*.whl
  "$PYTHON" -m pip download --no-deps --only-binary :all: -d "$OUT" diskcache
  ls -l "$OUT"/llcpp-convert-0.3.36.tar.xz "$OUT"/diskcache-*.whl
}

build_fla() {
  echo "== flash-linear-attention and fla-core (pure Python; the Gated DeltaNet anchor)"
  rm -f "$OUT"/flash_linear_attention-*.whl "$OUT"/fla_core-*.whl
  "$PYTHON" -m pip download --no-deps --only-binary :all: -d "$OUT" flash-linear-attention fla-core
  ls -l "$OUT"/flash_linear_attention-*.whl "$OUT"/fla_core-*.whl
}

for w in "${what[@]}"; do
  case $w in
    mamba) build_mamba ;;
    fla) build_fla ;;
    converter) build_converter ;;
    llamacpp) build_llamacpp ;;
    llamacpp-package) package_llamacpp ;;
    *) echo "unknown: $w (mamba, fla, converter, llamacpp, llamacpp-package)" >&2; exit 2 ;;
  esac
done
ls -l "$OUT"
