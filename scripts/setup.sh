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
# Debian's chromium and its driver, for the chat page's browser test (tests/server/test_chat_page.py), only where
# missing; where apt-get cannot run (not Debian, no root, no sudo) the test skips and says why
if ! { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null; } || echo "setup: chromium was not installed" >&2
  elif command -v apt-get >/dev/null && sudo -n true 2>/dev/null; then
    { sudo apt-get update -qq && sudo apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null; } || echo "setup: chromium was not installed" >&2
  else
    echo "setup: chromium is missing and apt-get cannot run here: the chat page's browser test will skip" >&2
  fi
fi
