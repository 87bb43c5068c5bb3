#!/usr/bin/env bash
# The whole test suite: sets up .venv when needed, then runs pytest. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
exec .venv/bin/python -m pytest "$@"
