"""The rows of the lossless matrix (tests/README.md): every drafter kind, and the variants of a kind
that run other code (a draft model with another tokenizer; token trees beside chains)."""

from __future__ import annotations

# row id -> the registry kind it runs
ROWS = {
    "ngram-simple": "ngram-simple",
    "ngram-map-k": "ngram-map-k",
    "ngram-map-k4v": "ngram-map-k4v",
    "ngram-mod": "ngram-mod",
    "ngram-cache": "ngram-cache",
    "suffix": "suffix",
    "grammar": "grammar",  # drafts what a request's grammar forces: its rows carry a grammar
    "draft-simple": "draft-simple",
    "draft-simple-cross": "draft-simple",  # cross_tokenizer=True: a draft model with another tokenizer
    "draft-mtp-chain": "draft-mtp",
    "draft-mtp-tree": "draft-mtp",  # tree_topk 2
    "draft-eagle3-chain": "draft-eagle3",
    "draft-eagle3-tree": "draft-eagle3",  # tree_topk 2
    "draft-dflash": "draft-dflash",
    "draft-dspark": "draft-dspark",
}

MODEL_FREE = [row for row in ROWS if not row.startswith("draft-")]

# options of the model-free rows on the matrix's short texts, where llama.cpp's keys (12 tokens for the
# n-gram map, 24 for ngram-mod) repeat nowhere and would never draft
OPTIONS = {"ngram-map-k": {"key_size": 3}, "ngram-map-k4v": {"key_size": 3}, "ngram-mod": {"n_match": 4, "n_min": 1}}

# rows whose drafter for the real target (tests/lossless/conftest.py) is random: they draft and are
# (almost) always rejected, so no accepted draft is asserted for them there
RANDOM_ON_REAL = {"draft-simple-cross", "draft-dflash", "draft-dspark"}
