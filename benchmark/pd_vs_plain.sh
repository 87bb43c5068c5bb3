#!/usr/bin/env bash
# launch_pd against one plain server, same workload through each, alternating rounds
# (issue 15's "launch_pd serving throughput >= 0.9x one plain server's"):
#   bash benchmark/pd_vs_plain.sh [ROUNDS] [extra serving.py flags]
# Each round starts a plain `launch_server` on :30010, runs benchmark/serving.py against it,
# stops it, then does the same with `launch_pd` (router on :30000). Servers run --dtype bfloat16.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}; shift || true
PY=.venv/bin/python
WORKLOAD=(--text-prompts --dtype bfloat16 --model default --num-prompts 48 --input-len 256 --output-len 64
          --max-concurrency 16 --rounds 1 --plot '' "$@")
SERVER_FLAGS=(--dtype bfloat16 --log-level warning)

wait_healthy() {  # url pid
  for _ in $(seq 1 240); do
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || { echo "server exited before it was healthy" >&2; return 1; }
    sleep 1
  done
  echo "server not healthy after 240 s" >&2; return 1
}

stop() { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

echo "[pd_vs_plain] $(date -u '+%F %T') UTC, load average: $(cut -d' ' -f1-3 /proc/loadavg), HEAD $(git rev-parse --short HEAD)"
for round in $(seq 1 "$ROUNDS"); do
  echo "[pd_vs_plain] round $round: plain server"
  $PY -m sglang.launch_server --model-path default --host 127.0.0.1 --port 30010 "${SERVER_FLAGS[@]}" \
      > /tmp/pd_vs_plain_plain.log 2>&1 &
  pid=$!
  wait_healthy http://127.0.0.1:30010 $pid
  $PY benchmark/serving.py --url http://127.0.0.1:30010 "${WORKLOAD[@]}" | grep -E "^\|" || true
  stop $pid
  echo "[pd_vs_plain] round $round: launch_pd"
  $PY -m sglang.launch_pd --model-path default -- "${SERVER_FLAGS[@]}" > /tmp/pd_vs_plain_pd.log 2>&1 &
  pid=$!
  wait_healthy http://127.0.0.1:30000 $pid
  $PY benchmark/serving.py --url http://127.0.0.1:30000 "${WORKLOAD[@]}" | grep -E "^\|" || true
  stop $pid
done
echo "[pd_vs_plain] done $(date -u '+%F %T') UTC, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
