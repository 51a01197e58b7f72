#!/usr/bin/env bash
# The main job on one machine: builds and starts the local stack, shows a
# multi-turn conversation reusing cached state, then keeps serving until
# Ctrl-C (SIGINT/SIGTERM drain it gracefully).
#
# Today the stack is the cachestore; the prefill and decode workers join it
# as their issues land.
#
# Environment: CACHESTORE_PORT (default 50051), METRICS_PORT (default 9091).
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/bootstrap.sh

CACHESTORE_PORT="${CACHESTORE_PORT:-50051}"
METRICS_PORT="${METRICS_PORT:-9091}"

bazel build //cachestore:cachestore //client:cachestore_cli
BIN="$(bazel info bazel-bin 2>/dev/null)"

LOG="$(mktemp -t hybridserve-cachestore.XXXXXX.log)"
"$BIN/cachestore/cachestore" --address="127.0.0.1:${CACHESTORE_PORT}" \
  --metrics_address="127.0.0.1:${METRICS_PORT}" >"$LOG" 2>&1 &
PID=$!
cleanup() { kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 0' INT TERM

for _ in $(seq 1 100); do
  grep -q CACHESTORE_READY "$LOG" && break
  kill -0 "$PID" 2>/dev/null || { cat "$LOG"; echo "cachestore failed to start" >&2; exit 1; }
  sleep 0.1
done
grep -q CACHESTORE_READY "$LOG" || { cat "$LOG"; echo "cachestore did not become ready" >&2; exit 1; }

echo "== cachestore serving on 127.0.0.1:${CACHESTORE_PORT} (log: $LOG)"
echo "== a three-turn conversation through the cache: each turn resumes where the last ended"
"$BIN/client/cachestore_cli" --target="127.0.0.1:${CACHESTORE_PORT}" demo
echo
"$BIN/client/cachestore_cli" --target="127.0.0.1:${CACHESTORE_PORT}" stats
cat <<TXT

== reach it
  gRPC (hybridserve.v1.CacheStore, health, reflection): 127.0.0.1:${CACHESTORE_PORT}
  Prometheus metrics: http://127.0.0.1:${METRICS_PORT}/metrics
  $BIN/client/cachestore_cli --target=127.0.0.1:${CACHESTORE_PORT} stats
Serving; Ctrl-C stops it.
TXT
wait "$PID"
