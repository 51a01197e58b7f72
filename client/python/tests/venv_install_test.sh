#!/usr/bin/env bash
# The Python client and the OpenAI gateway as a user installs them: a fresh
# venv (python3 -m venv), `pip install "./client/python[text]"` from PyPI's
# grpcio, grpcio-tools (at build time, in pip's isolated build environment),
# protobuf, tokenizers and jinja2 (pip's default cache), then
# installed_package_test.py against the real stack (Bazel-built cachestore,
# prefill and decode) serving the default model with
# tests/fixtures/byte_tokenizer's tokenizer files beside it; then
# `pip install ./gateway openai` into the same venv and
# gateway/tests/gateway_stack_test.py with the installed `hybridserve-gateway`
# driven by the official openai package from PyPI.
#
#   client/python/tests/venv_install_test.sh [unittest args]
#
# Needs PyPI (CI has it). tools/run_tests.sh runs it after the plain stage;
# HS_VENV_TEST=0 there skips it (offline machines). Runs from the repository
# root; leaves nothing but client/python/build and *.egg-info (gitignored:
# pip builds in the source tree).
set -euo pipefail
cd "$(dirname "$0")/../../.."

bazel build //cachestore/server:cachestore //prefill:prefill //decode:decode
BIN="$(bazel info bazel-bin 2>/dev/null)"
WORK="$(mktemp -d -t hs-venv-test.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# Debian's python3 (not a pyenv shim): the interpreter CI has.
/usr/bin/python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet --disable-pip-version-check "./client/python[text]"

# The model directory: the default model's weights and config, the tokenizer
# files of the fixture. Its base name is the served model name.
MODEL="$WORK/byte-model"
mkdir -p "$MODEL"
ln -s "$PWD/models/default/config.json" "$PWD/models/default/model.safetensors" "$MODEL/"
cp tests/fixtures/byte_tokenizer/*.json "$MODEL/"

# From the work directory: the checkout's client/python is not on sys.path,
# only the installed package.
REPO="$PWD"
cd "$WORK"
"$WORK/venv/bin/python" "$REPO/client/python/tests/installed_package_test.py" --bin "$BIN" --model_dir "$MODEL" "$@"

# The gateway, installed beside the client, and the official OpenAI client
# (the version tools/bootstrap.sh pins for the Bazel tests).
"$WORK/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$REPO/gateway" "openai==3.63.0"
PYTHONPATH="$REPO/client/python/tests" "$WORK/venv/bin/python" "$REPO/gateway/tests/gateway_stack_test.py" \
  --bin "$BIN" --repo "$REPO" --gateway_cmd "$WORK/venv/bin/hybridserve-gateway"
