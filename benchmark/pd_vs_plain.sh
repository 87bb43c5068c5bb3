#!/usr/bin/env bash
# launch_pd against one plain server, same workload through each, alternating rounds
# (issue 15's "launch_pd serving throughput >= 0.9x one plain server's"):
#   bash benchmark/pd_vs_plain.sh [ROUNDS] [extra serving.py flags]
# Each round starts a plain `launch_server` on :30010 and `launch_pd` (router on :30000), one after
# the other (which goes first alternates between rounds, so a drift of the machine's speed does not
# favour one), warms each up with 16 prompts that the measurement never repeats (no prefix-cache
# hits), measures 48 prompts (the same ones for both servers in a round, new ones each round) and
# stops it. Servers run --dtype bfloat16. The last lines give each round's ratio of output tok/s
# (launch_pd / plain, the two runs of one round are a minute apart) and their mean, min and max:
# on a shared 2-core VM single rounds move by +-5%, so judge the mean of several rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}; shift || true
PY=.venv/bin/python
WORKLOAD=(--text-prompts --dtype bfloat16 --model default --input-len 256 --output-len 64
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

serve() {  # name round -> prints the measured table row, sets OUT_TOKS
  local name=$1 round=$2 url pid
  if [ "$name" = plain ]; then
    $PY -m sglang.launch_server --model-path default --host 127.0.0.1 --port 30010 "${SERVER_FLAGS[@]}" \
        > /tmp/pd_vs_plain_plain.log 2>&1 &
    pid=$!; url=http://127.0.0.1:30010
  else
    $PY -m sglang.launch_pd --model-path default -- "${SERVER_FLAGS[@]}" > /tmp/pd_vs_plain_pd.log 2>&1 &
    pid=$!; url=http://127.0.0.1:30000
  fi
  wait_healthy $url $pid
  $PY benchmark/serving.py --url $url "${WORKLOAD[@]}" --num-prompts 16 --seed 1 > /dev/null 2>&1
  local row
  row=$($PY benchmark/serving.py --url $url "${WORKLOAD[@]}" --num-prompts 48 --seed $((100 + round)) 2>/dev/null \
        | grep -E "^\| given" | tail -1)
  stop $pid
  echo "| $name, round $round $row"
  OUT_TOKS=$(echo "$row" | awk -F'|' '{gsub(/ /, "", $5); print $5}')
}

echo "[pd_vs_plain] $(date -u '+%F %T') UTC, load average: $(cut -d' ' -f1-3 /proc/loadavg), HEAD $(git rev-parse --short HEAD)"
RATIOS=()
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then order=(plain launch_pd); else order=(launch_pd plain); fi
  declare -A toks=()
  for name in "${order[@]}"; do
    serve "$name" "$round"
    toks[$name]=$OUT_TOKS
  done
  RATIOS+=("$(echo "${toks[launch_pd]} ${toks[plain]}" | awk '{printf "%.3f", $1 / $2}')")
  echo "[pd_vs_plain] round $round: launch_pd / plain = ${RATIOS[-1]}"
done
echo "[pd_vs_plain] done $(date -u '+%F %T') UTC, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%s\n' "${RATIOS[@]}" | awk '{s += $1; if (NR == 1 || $1 < lo) lo = $1; if ($1 > hi) hi = $1}
  END {printf "[pd_vs_plain] launch_pd / plain out tok/s over %d rounds: mean %.3f, min %.3f, max %.3f\n", NR, s / NR, lo, hi}'
