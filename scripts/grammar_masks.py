"""Mask time per token of the grammar engine on the pulled models' vocabularies (docs/measurements/grammar-masks.md).

    python scripts/grammar_masks.py [threads]

For each of smollm2-135m, qwen2.5-coder-0.5b and gemma3-270m (GGUF files under $SPECDEC_HOME/models): the
time to build the vocabulary once, then, over a JSON answer that fits a small schema, the median and 90th
percentile of GrammarState.mask() (llguidance's bitmask turned into a (V,) bool tensor), llguidance's raw
bitmask alone, and xgrammar's bitmask for comparison (when it is installed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specdec.model.load import open_checkpoint
from specdec.model.token_bytes import token_bytes
from specdec.sampling.grammar import GrammarState, GrammarVocabulary, compile_grammar

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
          "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "tags"],
          "additionalProperties": False}
TEXT = '{"name": "Ada Lovelace, the first programmer", "age": 36, "tags": ["math", "engines", "poetry", "notes"]}'
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m")


def xgrammar_us(tokens, vocab_size: int, eos, ids) -> str:
    try:
        import xgrammar as xgr  # optional: only for the comparison
    except ImportError:
        return "not installed"
    info = xgr.TokenizerInfo(list(tokens), vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=eos)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    bitmask, times = xgr.allocate_token_bitmask(1, vocab_size), []
    for t in ids:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        times.append(time.perf_counter() - start)
        matcher.accept_token(t)
    return f"{np.median(times) * 1e6:.0f} us"


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads())
    home = Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec")) / "models"
    for name in MODELS:
        files = sorted((home / name).glob("*.gguf"))
        if not files:
            print(f"{name}: not pulled (specdec pull {name})")
            continue
        checkpoint, tok = open_checkpoint(files[0])
        size = checkpoint.config.vocab_size
        start = time.perf_counter()
        spelled = token_bytes(tok, size)
        vocab = GrammarVocabulary(spelled, tok.eos_ids, lambda text: tok.encode(text, add_bos=False))
        built = time.perf_counter() - start
        grammar = compile_grammar("json_schema", json.dumps(SCHEMA), vocab)
        ids = tok.encode(TEXT, add_bos=False)
        masks, raw = [], []
        for _ in range(3):
            state = GrammarState(grammar)
            for t in ids:
                start = time.perf_counter()
                state.mask()
                masks.append(time.perf_counter() - start)
                state.advance([t])
            state = GrammarState(grammar)  # a second pass: the bitmask alone (the matcher keeps the last one)
            for t in ids:
                start = time.perf_counter()
                state.matcher.compute_bitmask()
                raw.append(time.perf_counter() - start)
                state.advance([t])
        print(f"| {name} | {size} | {built:.2f} s | {np.median(masks) * 1e6:.0f} us | "
              f"{np.percentile(masks, 90) * 1e6:.0f} us | {np.median(raw) * 1e6:.0f} us | "
              f"{xgrammar_us(spelled.tokens, size, list(tok.eos_ids), ids)} |")


if __name__ == "__main__":
    main()
