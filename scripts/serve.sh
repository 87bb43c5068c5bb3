#!/usr/bin/env bash
# Serves the default model (SmolLM2-135M-Instruct) as a PD deployment on 127.0.0.1:
# prefill :30100 (bootstrap :8998) + decode :30200 (host_pool retraction) + sglang-router :30000.
# Extra arguments go to python -m sglang.launch_pd (e.g. --port 31000 -- --max-total-tokens 32k).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
exec .venv/bin/python -m sglang.launch_pd --model-path default "$@"
