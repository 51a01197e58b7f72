#!/usr/bin/env bash
# Installs every Debian 12 package the build and tests need, then the PyPI
# tools of the manifest checks (pinned). A no-op when they are all present.
# Needs root (or sudo) only when something is missing.
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
  python3-yaml             # tests/k8s: the rendered manifests
  python3-cryptography     # tools/make_test_certs.py: the TLS tests' certificates, made at test time
  python3-pip              # installs PIP_PACKAGES below
  python3-venv             # client/python/tests/venv_install_test.sh: pip install client/python into a fresh venv
  util-linux               # unshare, mount: tests/k8s/run_manifests_test's namespaces and /etc/hosts
  iproute2                 # ip: that test brings up loopback in its network namespace
  nftables                 # nft: tests/k8s/netpol_enforced_test enforces the NetworkPolicies in its namespace
  prometheus               # promtool: tests/k8s/monitoring_rules_test checks and tests the PromQL we ship
)

# PyPI tools of deploy/k8s/validate.sh and tests/k8s, the Python client's
# chat templates and the gateway's packages, pinned, installed for /usr/bin/python3: the interpreter
# Bazel's py_test and sh_test find on their PATH. (kubectl, which renders the
# manifests, is no Debian package: the machines come with it; see
# deploy/k8s/README.md.)
PIP_PACKAGES=(
  kubernetes-validate==1.37.0  # offline OpenAPI schemas of Kubernetes 1.32 to 1.37
  yamllint==1.38.0
  jinja2==3.1.6                # client/python chat templates (chat_template_test); Debian's 3.1.2 has sandbox escapes
  # The OpenAI gateway (gateway/README.md says why each): HTTP server, app, SSE,
  # text, metrics; and the official OpenAI client its tests drive it with.
  granian==2.8.9
  fastapi==0.165.0
  sse-starlette==3.7.1
  tokenizers==0.23.3
  prometheus-client==0.26.0
  openai==3.63.0
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  # The prometheus package (wanted for promtool only) installs a server and
  # enables its service: keep it from starting (policy-rc.d 101: no daemon
  # starts while installing), and where systemd runs, disable it after.
  policy_rc=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy_rc=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy_rc" >/dev/null
    $SUDO chmod 755 "$policy_rc"
  fi
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" || install_rc=$?
  if [ -n "$policy_rc" ]; then $SUDO rm -f "$policy_rc"; fi
  [ "${install_rc:-0}" -eq 0 ] || exit "$install_rc"
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
fi

missing_pip=()
for p in "${PIP_PACKAGES[@]}"; do
  [ "$(/usr/bin/python3 -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass' "${p%%==*}")" = "${p#*==}" ] || missing_pip+=("$p")
done
if [ ${#missing_pip[@]} -gt 0 ]; then
  echo "bootstrap: pip installing ${missing_pip[*]}" >&2
  # Debian marks its Python externally managed; these land in /usr/local.
  $SUDO /usr/bin/python3 -m pip install -q --break-system-packages --no-warn-script-location "${missing_pip[@]}"
fi
