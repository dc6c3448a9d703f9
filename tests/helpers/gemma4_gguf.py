"""Gemma 4's GGUF fixture (tests/model/data/gemma4-tiny/f32.gguf, q8_0.gguf; make_gguf.py): llama.cpp's converter
run on a copy of hf/ whose tokenizer is the Gemma-style one written here, which its gemma4 vocabulary reader needs.

    gemma_tokenizer   tokenizer.json / tokenizer_config.json: BPE over SentencePiece-style pieces (spaces as '▁')
                      with byte fallback: <pad> <eos> <bos> <unk>, the 256 <0xNN> bytes, then pieces and merges
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.gemma4 import FIXTURE

F32, Q8 = FIXTURE / "f32.gguf", FIXTURE / "q8_0.gguf"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0..3: hf/config.json's pad is 0
MERGES = ["a b", "▁ a", "▁a b", "ab c", "c d", "e d"]  # each one's result is a piece below
PIECES = ["▁", "a", "b", "c", "d", "e", "ab", "▁a", "▁ab", "abc", "cd", "ed"]


def gemma_tokenizer(folder: Path, vocab_size: int = 272) -> None:
    """A Gemma-style tokenizer of exactly vocab_size tokens into `folder` (its tokenizer.json and config)."""
    pieces = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    assert len(pieces) == vocab_size, (len(pieces), vocab_size)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(SPECIALS)],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[^\\n]+|[\\n]+"}, "behavior": "Isolated",
                          "invert": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(pieces)}, "merges": MERGES},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=1))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True}))
