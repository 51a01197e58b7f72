#!/usr/bin/env bash
# The main job on one machine: builds and starts the local stack on the
# embedded default model (models/default) - the cachestore, one prefill worker
# and one decode worker as three processes on loopback, and the OpenAI HTTP
# gateway in front of decode - plays a three-turn chat through the
# command-line client (each turn resumes from the state the previous one left
# in the cachestore) and one chat through the OpenAI API with curl, then keeps
# serving until Ctrl-C, which drains them all.
#
#   deploy/local/start.sh                 # disaggregated: cachestore + prefill + decode
#   deploy/local/start.sh --aggregated    # cachestore + one decode process running prefill in process
#   deploy/local/start.sh --no-serve      # stop after the chat (used by tests)
#
# Environment: DECODE_PORT (default 50050), PREFILL_PORT (50061),
# CACHESTORE_PORT (50051), GATEWAY_PORT (8080: the OpenAI API, its /health and
# /metrics), METRICS_PORT (9091, cachestore; decode uses +1, prefill +2),
# THREADS (kernel threads per engine, default 1).
set -euo pipefail
cd "$(dirname "$0")/../.."

AGGREGATED=0
SERVE=1
for arg in "$@"; do
  case "$arg" in
    --aggregated) AGGREGATED=1 ;;
    --no-serve) SERVE=0 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done

tools/bootstrap.sh

DECODE_PORT="${DECODE_PORT:-50050}"
PREFILL_PORT="${PREFILL_PORT:-50061}"
CACHESTORE_PORT="${CACHESTORE_PORT:-50051}"
GATEWAY_PORT="${GATEWAY_PORT:-8080}"
METRICS_PORT="${METRICS_PORT:-9091}"
THREADS="${THREADS:-1}"

bazel build //cachestore/server:cachestore //prefill:prefill //decode:decode //client:hybridserve_cli //gateway:gateway
BIN="$(bazel info bazel-bin 2>/dev/null)"
LOGDIR="$(mktemp -d -t hybridserve.XXXXXX)"

PIDS=()
cleanup() {
  # Drain in dependency order: the gateway first, then decode (it finishes
  # its streams), then prefill, then the cachestore.
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 0' INT TERM

# start NAME READY_WORD command...: starts a process, waits for its ready line.
start() {
  local name="$1" word="$2"
  shift 2
  "$@" >"$LOGDIR/$name.log" 2>&1 &
  local pid=$!
  PIDS=("$pid" "${PIDS[@]}")
  for _ in $(seq 1 300); do
    grep -q "$word" "$LOGDIR/$name.log" && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$LOGDIR/$name.log"; echo "$name failed to start" >&2; exit 1; }
    sleep 0.1
  done
  cat "$LOGDIR/$name.log"
  echo "$name did not become ready" >&2
  exit 1
}

# The workers share this host with the cachestore: they read cached entries
# through its shared-memory socket (gRPC stays the control plane and the
# fallback); decode reads each resumed prompt's pages itself, so prefill sends
# only the pages after them.
SHM_SOCKET="$LOGDIR/cachestore.sock"
start cachestore CACHESTORE_READY "$BIN/cachestore/server/cachestore" --address="127.0.0.1:${CACHESTORE_PORT}" \
  --metrics_address="127.0.0.1:${METRICS_PORT}" --shm_socket="$SHM_SOCKET"
if [ "$AGGREGATED" = 1 ]; then
  start decode DECODE_READY "$BIN/decode/decode" --model_dir=models/default --address="127.0.0.1:${DECODE_PORT}" \
    --prefill=in_process --cachestore="127.0.0.1:${CACHESTORE_PORT}" --cachestore_shm_socket="$SHM_SOCKET" \
    --threads="$THREADS" \
    --metrics_address="127.0.0.1:$((METRICS_PORT + 1))"
  MODE="aggregated: cachestore + decode (prefill in process)"
else
  start prefill PREFILL_READY "$BIN/prefill/prefill" --model_dir=models/default --address="127.0.0.1:${PREFILL_PORT}" \
    --cachestore="127.0.0.1:${CACHESTORE_PORT}" --cachestore_shm_socket="$SHM_SOCKET" --threads="$THREADS" \
    --metrics_address="127.0.0.1:$((METRICS_PORT + 2))"
  start decode DECODE_READY "$BIN/decode/decode" --model_dir=models/default --address="127.0.0.1:${DECODE_PORT}" \
    --prefill="127.0.0.1:${PREFILL_PORT}" --cachestore="127.0.0.1:${CACHESTORE_PORT}" \
    --cachestore_shm_socket="$SHM_SOCKET" --threads="$THREADS" \
    --metrics_address="127.0.0.1:$((METRICS_PORT + 1))"
  MODE="disaggregated: cachestore, prefill and decode processes, state over the TCP data plane, cache reads by shared memory; the first turn prefilled by the prefill worker, the next turns resumed and prefilled by decode itself"
fi

# The OpenAI API in front of decode: the default model's byte vocabulary and
# its chat framing; no API keys on this local stack (gateway/README.md).
start gateway GATEWAY_READY "$BIN/gateway/gateway" --decode="127.0.0.1:${DECODE_PORT}" --model_dir=models/default \
  --address="127.0.0.1:${GATEWAY_PORT}"

echo "== hybridserve on the embedded default model ($MODE; logs in $LOGDIR)"
echo "== a three-turn chat: each turn's prompt is the whole conversation, resumed from the cached turn end"
"$BIN/client/hybridserve_cli" chat --target="127.0.0.1:${DECODE_PORT}" --max_tokens=120 --temperature=0.7 --seed=7 \
  --turns="What is the secret of a happy life?|Tell me more about that.|Thank you, goodbye."

echo
echo "== the OpenAI API (the gateway): one chat completion with curl, its usage says how many prompt tokens were cached"
OPENAI_CHAT='{"model": "default", "messages": [{"role": "user", "content": "What is the secret of a happy life?"}], "max_tokens": 60, "temperature": 0.7, "seed": 7}'
curl -sS --fail-with-body "http://127.0.0.1:${GATEWAY_PORT}/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "$OPENAI_CHAT"
echo

# The CLI as a person types it from the checkout: through the bazel-bin
# symlink, unless that points at another build's output (e.g. a bazel run
# with another --output_base since), then by its full path.
CLI="$BIN/client/hybridserve_cli"
if [ "$(readlink -f bazel-bin 2>/dev/null)" = "$(readlink -f "$BIN")" ]; then
  CLI="bazel-bin/client/hybridserve_cli"
fi

cat <<TXT

== reach it (commands run from the checkout, $PWD)
  Generation gRPC (hybridserve.v1.Generation, health, reflection): 127.0.0.1:${DECODE_PORT}
  $CLI chat --target=127.0.0.1:${DECODE_PORT}
  $CLI generate --target=127.0.0.1:${DECODE_PORT} --prompt_ids=257,72,105 --max_tokens=16
  metrics: cachestore http://127.0.0.1:${METRICS_PORT}/metrics, decode http://127.0.0.1:$((METRICS_PORT + 1))/metrics$([ "$AGGREGATED" = 1 ] || echo ", prefill http://127.0.0.1:$((METRICS_PORT + 2))/metrics"), gateway http://127.0.0.1:${GATEWAY_PORT}/metrics

  OpenAI API (the gateway): http://127.0.0.1:${GATEWAY_PORT}/v1
  curl -N http://127.0.0.1:${GATEWAY_PORT}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "default", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}'
  python3 - <<'PY'   # the official client (pip install openai; tools/bootstrap.sh installed it for /usr/bin/python3)
from openai import OpenAI
client = OpenAI(base_url="http://127.0.0.1:${GATEWAY_PORT}/v1", api_key="none")
print(client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hello!"}]).choices[0].message.content)
PY
TXT
if [ "$SERVE" = 0 ]; then exit 0; fi
echo "Serving; Ctrl-C stops it."
wait "${PIDS[0]}"
