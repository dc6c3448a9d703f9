#!/usr/bin/env bash
# The main job: set up, pull the default model, then one speculative generation that shows
# the speed-up over plain decoding and the acceptance, measured in the same process.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
specdec pull smollm2-135m
specdec demo "$@"
