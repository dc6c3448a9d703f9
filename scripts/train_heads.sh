#!/usr/bin/env bash
# Train the MTP and EAGLE-3 heads specdec ships for a model (src/specdec/heads/<model>/).
#
#   scripts/train_heads.sh OUT [TRAIN_MINUTES] [MODEL]
#
# One data set for both heads: the target continues the built-in prompts (sampled, T=0.7)
# and stdlib docstrings are added (specdec/train/data.py; never the bench prompts). Then the
# two heads train side by side on it, each for TRAIN_MINUTES (the step count and its
# learning-rate schedule are fitted to that time). Meant for a GPU (the shipped heads were
# made on one H200); it runs on a CPU too, slowly. Python: `python3`, or $PYTHON. Environment:
# GENERATE, GEN_TOKENS, CORPUS_SEQS, VAL, SAVE_EVERY size the run; DEADLINE (seconds) caps it;
# SEQUENCES=src/specdec/heads/smollm2-135m/train_data.npz trains on the shipped heads' data.
# PROMPTS=FILE continues those prompts instead of the built-in ones (the recipe's:
# $SPECDEC_HOME/train/prompts-v1.jsonl, `python -m specdec.train.recipe build`); EAGLE3_TTT
# sets EAGLE-3's training-time-test steps (4 made the shipped head; SpecForge's recipe is 7).
set -euo pipefail
out=${1:?usage: scripts/train_heads.sh OUT [TRAIN_MINUTES] [MODEL]}
minutes=${2:-5}
model=${3:-smollm2-135m}
py=${PYTHON:-python3}
common=(--model "$model" --name "$model" --generate "${GENERATE:-4096}" --gen-tokens "${GEN_TOKENS:-256}"
        --seq-len 384 --corpus-seqs "${CORPUS_SEQS:-1024}" --val "${VAL:-64}" --seed 0
        ${PROMPTS:+--prompts "$PROMPTS"})

# 1. the data (OUT/mtp/data.rank0.npz; --steps 0 trains nothing), or SEQUENCES=FILE from an earlier run
if [[ -n "${SEQUENCES:-}" ]]; then
    data=(--sequences "$SEQUENCES")
else
    "$py" -m specdec.cli train mtp "${common[@]}" --steps 0 --out "$out/mtp"
    data=(--sequences "$out/mtp/data.rank0.npz")
fi

# with DEADLINE (seconds from the start of this script), training gets what is left of it
if [[ -n "${DEADLINE:-}" ]]; then
    minutes=$("$py" -c "print(round(min($minutes, ($DEADLINE - $SECONDS - 45) / 60), 2))")
    echo "training for $minutes minutes"
fi

# 2. both heads on that data
"$py" -m specdec.cli train mtp "${common[@]}" "${data[@]}" --steps 100000 --batch 32 --lr 5e-4 --ttt 3 \
    --save-every "${SAVE_EVERY:-500}" --max-minutes "$minutes" --out "$out/mtp" > "$out/mtp.log" 2>&1 &
mtp=$!
"$py" -m specdec.cli train eagle3 "${common[@]}" "${data[@]}" --steps 100000 --batch 64 --lr 5e-4 --ttt "${EAGLE3_TTT:-4}" \
    --draft-vocab 4096 --save-every "${SAVE_EVERY:-500}" --max-minutes "$minutes" --out "$out/eagle3" \
    > "$out/eagle3.log" 2>&1 &
eagle=$!
status=0
wait $mtp || status=$?
wait $eagle || status=$?
tail -c 2000 "$out/mtp.log" | tr '\r' '\n' | tail -4
tail -c 2000 "$out/eagle3.log" | tr '\r' '\n' | tail -4
exit $status
