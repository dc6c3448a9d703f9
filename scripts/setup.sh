#!/usr/bin/env bash
# Creates .venv with the pinned dependencies (torch 2.13.0 CPU) and installs specdec into it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e '.[test]'
