#!/usr/bin/env bash
# A long CPU training run in the background, at the lowest priority, that later sessions continue:
#
#   scripts/train_background.sh [KIND] [MODEL]        (default: eagle3 smollm2-135m)
#
# The same command starts it and resumes it (`specdec train --resume`): the state lives under
# $SPECDEC_HOME/train/<model file>/<kind>/ (state.pt, data.rank0.npz, or data.rank0.partial.npz while the
# target is still writing the answers), so a run stopped anywhere, in generation or in training, goes on
# from its last batch or checkpoint. The log is train.log there; curves.png / curves.json show the
# learning curves, train_summary.json the last result. Prompts: the recipe's file
# ($SPECDEC_HOME/train/prompts-v1.jsonl, `python -m specdec.train.recipe fetch` then `build`).
# Environment: GENERATE, GEN_TOKENS, CORPUS_SEQS, VAL, STEPS, BATCH, SAVE_EVERY, THREADS size the run (a
# resumed run must repeat the sizes it started with); PYTHON: the interpreter (default python3).
set -euo pipefail
kind=${1:-eagle3}
model=${2:-smollm2-135m}
py=${PYTHON:-python3}
home=${SPECDEC_HOME:-$HOME/.cache/specdec}
prompts=$home/train/prompts-v1.jsonl
if [[ ! -f $prompts ]]; then
    "$py" -m specdec.train.recipe build >/dev/null  # from the checkouts `recipe fetch` made
fi
file=$("$py" -c "import sys; from specdec.model.catalogue import resolve; print(resolve(sys.argv[1]).name)" "$model")
out=$home/train/$file/$kind
mkdir -p "$out"
if [[ -f $out/pid ]] && kill -0 "$(cat "$out/pid")" 2>/dev/null; then
    echo "already running (pid $(cat "$out/pid")); log: $out/train.log"
    exit 0
fi
echo "--- $(date -u +%FT%TZ) start" >> "$out/train.log"
nohup nice -n 19 "$py" -m specdec.cli train "$kind" --model "$model" --name "$model" --prompts "$prompts" \
    --out "$out" --resume --generate "${GENERATE:-2048}" --gen-tokens "${GEN_TOKENS:-256}" --seq-len 384 \
    --corpus-seqs "${CORPUS_SEQS:-256}" --val "${VAL:-64}" --steps "${STEPS:-1000}" --batch "${BATCH:-4}" \
    --lr 5e-4 --draft-vocab 4096 --save-every "${SAVE_EVERY:-25}" --threads "${THREADS:-1}" --device cpu \
    >> "$out/train.log" 2>&1 < /dev/null &
echo $! > "$out/pid"
echo "started (pid $!); log: $out/train.log"
