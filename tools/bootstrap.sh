#!/usr/bin/env bash
# Installs every Debian 12 package the build and tests need. A no-op when they
# are all present. Needs root (or sudo) only when something is missing.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3, offline with third_party/ stand-ins
  clang                    # compiler with -Wthread-safety
  libclang-rt-14-dev       # sanitizer runtimes for --config=asan/tsan
  libgrpc++-dev            # gRPC 1.51 (+ reflection, health)
  protobuf-compiler-grpc   # grpc_cpp_plugin, grpc_python_plugin
  libprotobuf-dev          # protobuf 3.21
  protobuf-compiler        # protoc
  libabsl-dev              # abseil 20220623
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  nlohmann-json3-dev       # JSON: config.json, safetensors headers
  libxxhash-dev            # XXH3 keys and checksums
  libgoogle-glog-dev       # logging
  prometheus-cpp-dev       # metrics (core: registry, text format; its civetweb exposer is not used)
  libmicrohttpd-dev        # the /metrics HTTP server: one event loop, idle clients cannot starve it
  libopenblas-dev          # CPU GEMM (fast, non-deterministic mode)
  python3-grpcio           # Python client (client/python): grpcio 1.51 for /usr/bin/python3
  python3-protobuf         # Python client: protobuf 3.21 runtime for its generated stubs
  python3-numpy            # tools/check_fixtures.py and tools/gen_model.py (CI checks the fixtures)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
