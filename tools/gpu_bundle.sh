#!/usr/bin/env bash
# Builds every GPU test and benchmark (-c opt; nvcc for sm_80 and sm_90 plus
# compute_90 PTX: third_party/cuda.bzl's CUDA_GENCODE, the default) and packs
# what a lent GPU machine lacks into one file, gpu_bundle/hs-gpu-bundle.tar.xz
# (ignored by git), beside gpu_bundle/run.sh that unpacks and runs it there:
#
#   libexec/     the binaries, stripped
#   bin/         a launcher per binary: the bundle's own loader and libraries
#                (lib/ld-linux-x86-64.so.2 --library-path lib libexec/X), so
#                the other machine's libc does not matter
#   lib/         the loader, Debian 12's glibc and every Debian library the
#                binaries load (from ldd): gRPC, protobuf, abseil, glog,
#                OpenBLAS, ...; NOT the CUDA libraries named in
#                host_sonames.txt (cudart, cuBLAS, cuBLASLt, NCCL, the
#                driver), which run.sh finds on the GPU machine
#   runfiles/hybridserve/   what the tests read by Runfile(): the decode,
#                prefill and cachestore launchers; models/default and
#                tests/fixtures/{golden,models} are linked in from the
#                repository copy when the bundle is unpacked (fixtures.txt)
#   tools/gen_model*.py     run.sh generates the benchmark models with them
#   run.sh, summarize.py, MANIFEST.txt, host_sonames.txt
#
# Then it checks the bundle (tools/gpu_bundle_check.sh) and prints its size:
# the compressed file travels with the working tree, 64 MiB together at most.
#
#   tools/gpu_bundle.sh                build, pack, check
#   tools/gpu_bundle.sh --no-build     pack what the last -c opt build left
#   HS_BUNDLE_BAZEL_ARGS="--config=..." tools/gpu_bundle.sh   extra bazel args
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$PWD

build=1
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    *) echo "usage: $0 [--no-build]" >&2; exit 2 ;;
  esac
done

# label -> name in the bundle. Tests first, then benchmarks, then the
# binaries the tests and benchmarks start as child processes.
TESTS=(
  //kernels/cuda:attention_test //kernels/cuda:conv1d_test //kernels/cuda:cuda_backend_test
  //kernels/cuda:elementwise_test //kernels/cuda:matmul_test //kernels/cuda:ssd_test //kernels/cuda:gated_delta_test
  //kernels/cuda:moe_test //kernels/cuda:rows_test
  //engine:model_golden_test //engine:model_parity_test //engine:model_decode_test //engine:model_backend_test
  //transport:nccl_communicator_test //tests/e2e:gpu_stack_test
)
BENCHES=(
  //bench/kernels:cuda_kernels_bench //bench/kernels:gdn_cuda_bench //bench/transport:gpu_transfer_bench
  //bench/engine:throughput_bench //bench/serving:serving_bench
)
SERVICES=(//decode:decode //prefill:prefill //cachestore/server:cachestore)
# Repository folders the tests read through runfiles, linked in on the machine.
FIXTURES=(models/default tests/fixtures/golden tests/fixtures/models)
# Loaded from the GPU machine (CUDA 13 toolkit, PyTorch's nvidia-* cu13 wheels, the driver).
HOST_SONAMES=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcuda.so.1)

# shellcheck disable=SC2206  # extra arguments, split on spaces
bazel_args=(-c opt ${HS_BUNDLE_BAZEL_ARGS:-})
if [ $build -eq 1 ]; then
  echo "== bazel build ${bazel_args[*]} (${#TESTS[@]} tests, ${#BENCHES[@]} benchmarks, ${#SERVICES[@]} services)"
  bazel build "${bazel_args[@]}" -- "${TESTS[@]}" "${BENCHES[@]}" "${SERVICES[@]}"
fi
bin_dir=$(bazel info "${bazel_args[@]}" bazel-bin 2>/dev/null)

out_dir=$root_dir/gpu_bundle
stage=$(mktemp -d /tmp/hs-gpu-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
b=$stage/hs-gpu-bundle
mkdir -p "$b"/{bin,libexec,lib,tools,runfiles/hybridserve}

label_path() { local l=${1#//}; echo "${l%%:*}/${l##*:}"; }

# launcher PATH NAME UP: a script at PATH that runs libexec/NAME; UP leads from
# PATH's folder to the bundle's root.
launcher() {
  cat >"$1" <<EOF
#!/bin/sh
# Runs libexec/$2 with this bundle's loader and libraries (and the GPU
# machine's CUDA libraries from HS_CUDA_LIBRARY_PATH, which run.sh sets).
b="\${0%/*}/$3"
exec "\$b/lib/ld-linux-x86-64.so.2" --library-path "\$b/lib\${HS_CUDA_LIBRARY_PATH:+:\$HS_CUDA_LIBRARY_PATH}" \\
  --argv0 "\$0" "\$b/libexec/$2" "\$@"
EOF
  chmod 755 "$1"
}

echo "== binaries (stripped)"
for label in "${TESTS[@]}" "${BENCHES[@]}" "${SERVICES[@]}"; do
  p=$(label_path "$label")
  name=${p##*/}
  install -m 755 "$bin_dir/$p" "$b/libexec/$name"
  strip "$b/libexec/$name"
  launcher "$b/bin/$name" "$name" ..
done
for label in "${SERVICES[@]}"; do
  p=$(label_path "$label")
  mkdir -p "$b/runfiles/hybridserve/${p%/*}"
  # From runfiles/hybridserve/<p's folder> up to the bundle's root: two
  # levels plus one per folder in p (cachestore/server/cachestore: four).
  up=../..
  rest=${p%/*}
  while [ -n "$rest" ]; do
    up=$up/..
    case "$rest" in */*) rest=${rest#*/} ;; *) rest= ;; esac
  done
  launcher "$b/runfiles/hybridserve/$p" "${p##*/}" "$up"
done

echo "== libraries"
is_host() { local s; for s in "${HOST_SONAMES[@]}"; do [ "$1" = "$s" ] && return 0; done; return 1; }
# The loader and all of Debian's glibc (libpthread, librt, libdl, ... that the
# CUDA libraries load too), so that no library of the other machine's libc mixes in.
cp -L /lib64/ld-linux-x86-64.so.2 "$b/lib/ld-linux-x86-64.so.2"
for f in $(dpkg -L libc6 | grep -E '^/lib/x86_64-linux-gnu/lib[^/]*\.so\.[0-9.]+$'); do cp -L "$f" "$b/lib/"; done
# ldd on the built binaries, where their $ORIGIN runpaths lead to Bazel's
# shared libraries of our own code (tests link it dynamically): those come
# along too, stripped, each once for every binary that loads it.
for label in "${TESTS[@]}" "${BENCHES[@]}" "${SERVICES[@]}"; do
  f=$bin_dir/$(label_path "$label")
  ldd "$f" | awk '/=>/ { print $1, $3 }' | while read -r soname path; do
    is_host "$soname" && continue
    if [ "$path" = "not" ]; then echo "ldd: $f needs $soname, not found here" >&2; exit 1; fi
    [ -e "$b/lib/$soname" ] && continue
    cp -L "$path" "$b/lib/$soname"
    case "$(readlink -f "$path")" in */bazel-out/*) chmod u+w "$b/lib/$soname" && strip "$b/lib/$soname" ;; esac
  done
done
chmod 644 "$b"/lib/*.so*
chmod 755 "$b/lib/ld-linux-x86-64.so.2"

echo "== tools, scripts (the fixtures are not packed)"
# The tests' fixtures travel in the repository copy the device command starts
# in (they are tracked files, so they always travel): run.sh and
# gpu_bundle_check.sh link these folders of it into runfiles/hybridserve/
# after unpacking. Packing them too sent 28 MiB twice and took the bundle
# and the working tree past the 64 MiB that travel.
printf '%s\n' "${FIXTURES[@]}" >"$b/fixtures.txt"
install -m 755 tools/gen_model.py "$b/tools/gen_model.py"
install -m 644 tools/gen_model_*.py "$b/tools/"
install -m 755 tools/gpu_bundle/run.sh "$b/run.sh"
install -m 644 tools/gpu_bundle/summarize.py "$b/summarize.py"
install -m 755 tools/gpu_bundle/profile.sh "$b/profile.sh"
printf '%s\n' "${HOST_SONAMES[@]}" >"$b/host_sonames.txt"
{
  echo "hybridserve GPU bundle"
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "bazel: ${bazel_args[*]}"
  echo "nvcc targets (third_party/cuda.bzl): $(grep -o 'arch=compute_[0-9a-z]*,code=[a-z_0-9]*' third_party/cuda.bzl | tr '\n' ' ')"
  echo "kernels' fatbin in ssd_test: $(size -A "$b/libexec/ssd_test" | awk '$1 == ".nv_fatbin" { print $2 }') bytes"
  echo "needs from the GPU machine (host_sonames.txt): ${HOST_SONAMES[*]}"
  echo "tests: ${TESTS[*]}"
  echo "benchmarks: ${BENCHES[*]}"
  echo "files (bytes):"
  (cd "$b" && find . -type f -printf '%s %p\n' | sort -k2)
} >"$b/MANIFEST.txt"

echo "== compress"
mkdir -p "$out_dir"
rm -f "$out_dir/hs-gpu-bundle.tar.xz"
# One xz stream with a dictionary larger than the tar: the kernels' fatbin, repeated in
# every binary, is stored about once.
tar -C "$stage" --owner=0 --group=0 --sort=name -cf - hs-gpu-bundle |
  xz -T1 --lzma2=preset=6,dict=192MiB >"$out_dir/hs-gpu-bundle.tar.xz.tmp"
mv "$out_dir/hs-gpu-bundle.tar.xz.tmp" "$out_dir/hs-gpu-bundle.tar.xz"
install -m 755 tools/gpu_bundle/run.sh "$out_dir/run.sh"
cp "$b/MANIFEST.txt" "$out_dir/MANIFEST.txt"

raw=$(du -sb "$b" | cut -f1)
packed=$(stat -c %s "$out_dir/hs-gpu-bundle.tar.xz")
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
mib() { awk -v n="$1" 'BEGIN {printf "%.1f MiB", n / 1048576}'; }
echo "bundle: $(mib "$raw") unpacked, $(mib "$packed") as gpu_bundle/hs-gpu-bundle.tar.xz;" \
  "with the working tree ($(mib "$tree")): $(mib $((packed + tree))) of the 64 MiB that travel"
if [ $((packed + tree)) -gt $((64 * 1048576)) ]; then
  echo "TOO LARGE: the bundle and the working tree exceed 64 MiB" >&2
  exit 1
fi

echo "== check"
tools/gpu_bundle_check.sh "$out_dir/hs-gpu-bundle.tar.xz"
echo "on the GPU machine: device run carrying gpu_bundle, command: OUT=\$OUT gpu_bundle/run.sh"
