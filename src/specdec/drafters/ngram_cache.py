"""ngram-cache: llama.cpp's three tiers of n-gram counts (this context, earlier outputs, a
static corpus file), drafting greedily token by token while a tier is confident.

    >>> d = NgramCache()
    >>> d.begin([5, 6, 7, 5, 6, 7, 5, 6])
    >>> d.propose([5, 6, 7, 5, 6, 7, 5, 6], draft_length=2).tokens
    (7, 5)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from specdec.drafters.base import Draft
from specdec.drafters.ngram import IncrementalDrafter, NgramKey, check_order

# Confidence thresholds per n-gram size 1, 2, 3, 4+ (llama.cpp's ngram-cache values): the
# n-gram must have been followed at least MIN_SAMPLES times, and the drafted token in at
# least MIN_PERCENT % of them. This request's own text is trusted more (lax) than other
# requests or a corpus (strict).
LAX_MIN_SAMPLES, LAX_MIN_PERCENT = (2, 2, 1, 1), (66, 50, 50, 50)
STRICT_MIN_SAMPLES, STRICT_MIN_PERCENT = (4, 3, 2, 2), (75, 66, 66, 66)

NgramCounts = dict[NgramKey, dict[int, int]]  # ngram -> {next token: count}


def _count_ngrams(
    counts: NgramCounts, tokens: Sequence[int], i: int, n_min: int, n_max: int
) -> None:
    """Count token i after each n-gram (n_min <= n <= n_max) that ends just before it."""
    token = tokens[i]
    for n in range(n_min, min(n_max, i) + 1):
        nexts = counts.setdefault(tuple(tokens[i - n : i]), {})
        nexts[token] = nexts.get(token, 0) + 1


def _pick(
    nexts: dict[int, int],
    prior: dict[int, int] | None,
    n: int,
    min_samples: tuple[int, ...],
    min_percent: tuple[int, ...],
) -> int | None:
    """The most likely next token if it passes the thresholds for n-gram size n.

    Counts are weighted by the static corpus (`prior`, counts after the last static_n
    tokens) as llama.cpp does: a token the corpus knows counts 100x its corpus count.
    """
    best, best_score, best_count, total = None, 0, 0, 0
    for token, count in nexts.items():
        score = count * (100 * prior[token] if prior and token in prior else 1)
        if score > best_score:
            best, best_score, best_count = token, score, count
        total += count
    level = min(n, len(min_samples)) - 1
    if total < min_samples[level] or 100 * best_count < min_percent[level] * total:
        return None
    return best


def load_corpus(path: str | os.PathLike) -> list[list[int]]:
    """Read a static corpus of token ids: a list of documents (n-grams never span two).

    Formats, by extension:
      .json  a list of ids, or a list of lists of ids (one per document) - what save_corpus writes
      .npy   a 1-D integer array (one document)
      other  text: whitespace-separated decimal ids, one document per line
    """
    p = Path(path)
    expected = "a JSON list of token ids (or of such lists), a 1-D integer .npy, or a text of ids"
    if not p.is_file():
        problem = "is a folder" if p.is_dir() else "does not exist"
        raise FileNotFoundError(f"ngram-cache corpus {p} {problem}; give {expected}")
    try:
        if p.suffix == ".npy":
            array = np.load(p, allow_pickle=False)
            if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
                raise ValueError(f"found a {array.ndim}-D {array.dtype} array")
            docs = [array.tolist()]
        elif p.suffix == ".json":
            data = json.loads(p.read_text())
            if isinstance(data, list) and data and all(isinstance(d, list) for d in data):
                docs = data
            else:
                docs = [data]
        else:
            lines = [line for line in p.read_text().splitlines() if line.strip()]
            docs = [[int(word) for word in line.split()] for line in lines]
        for doc in docs:
            if not isinstance(doc, list) or not all(type(t) is int and t >= 0 for t in doc):
                raise ValueError("found something other than non-negative integer ids")
    except (ValueError, OSError, UnicodeDecodeError) as err:
        raise ValueError(f"ngram-cache corpus {p} is not {expected}: {err}") from None
    if not any(docs):
        raise ValueError(f"ngram-cache corpus {p} holds no token ids; give {expected}")
    return docs


def save_corpus(path: str | os.PathLike, docs: Sequence[Sequence[int]]) -> None:
    """Write documents of token ids in the .json format load_corpus reads."""
    Path(path).write_text(json.dumps([[int(t) for t in doc] for doc in docs]))


@dataclass
class NgramCache(IncrementalDrafter):
    """llama.cpp's ngram-cache: greedy token-by-token drafting from three tiers of counts.

    For each drafted position, the n-grams ending there (longest first) are looked up in
      1. context: this request's prompt + output          (lax thresholds)
      2. dynamic: outputs of earlier requests, via end()   (strict thresholds)
      3. static:  a corpus file, static_n-grams only       (strict thresholds)
    and the first tier that yields a confident token wins; the static counts also weight
    the other tiers' candidates. Drafting stops at the first position with no confident token.

    Defaults ngram_min=1, ngram_max=4, static_n=2 are llama.cpp's; its thresholds (above)
    keep 1-grams from drafting unless the continuation is nearly unanimous. The dynamic
    tier counts outputs only (not prompts) and, as in llama.cpp, is not bounded.
    """

    ngram_min: int = 1
    ngram_max: int = 4
    static_n: int = 2
    static_path: str | os.PathLike | None = None
    static_corpus: Sequence[Sequence[int]] | None = field(default=None, repr=False)
    name: str = field(default="ngram-cache", init=False)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs) -> "NgramCache":
        """An ngram-cache whose static tier is the corpus in `path` (see load_corpus)."""
        return cls(static_path=path, **kwargs)

    def _check_args(self) -> None:
        check_order(self.name, ngram_min=self.ngram_min, ngram_max=self.ngram_max, static_n=self.static_n)
        if self.ngram_max < self.ngram_min:
            raise ValueError(
                f"{self.name}: ngram_max ({self.ngram_max}) must be >= ngram_min ({self.ngram_min})"
            )
        if self.static_path is not None and self.static_corpus is not None:
            raise ValueError(f"{self.name}: give static_path or static_corpus, not both")
        corpus = self.static_corpus
        if corpus is not None and not (isinstance(corpus, (list, tuple)) and all(
                isinstance(doc, (list, tuple)) and all(type(t) is int and t >= 0 for t in doc) for doc in corpus)):
            raise ValueError(f"{self.name}: static_corpus must be a list of token-id lists (got {str(corpus)[:40]}); "
                             "to read a corpus from a file, give static_path=FILE")
        if self.static_path is not None and not isinstance(self.static_path, (str, os.PathLike)):
            raise ValueError(f"{self.name}: static_path must be a file name (got {self.static_path!r})")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.static_path is not None:
            docs = load_corpus(self.static_path)
        else:
            docs = self.static_corpus or []
        self._static: NgramCounts = {}
        self._static_max = -1  # the largest id of the corpus (check_vocab)
        for doc in docs:
            doc = [int(t) for t in doc]
            self._static_max = max(self._static_max, *doc) if doc else self._static_max
            for i in range(self.static_n, len(doc)):
                _count_ngrams(self._static, doc, i, self.static_n, self.static_n)
        self._dynamic: NgramCounts = {}

    def check_vocab(self, vocab_size: int) -> None:
        """A corpus holding an id the target has no row for (made with another tokenizer) is one error when
        the drafter is built, not an IndexError in the target's embedding when it drafts that id."""
        if self._static_max >= vocab_size:
            where = self.static_path if self.static_path is not None else "static_corpus"
            raise ValueError(f"ngram-cache corpus {where} holds token id {self._static_max}, outside the target's "
                             f"vocabulary of {vocab_size} (made with another tokenizer?)")

    def _reset(self) -> None:
        super()._reset()
        self._context: NgramCounts = {}

    def _append(self, i: int) -> None:
        _count_ngrams(self._context, self._tokens, i, self.ngram_min, self.ngram_max)

    def end(self, output: Sequence[int]) -> None:
        output = [int(t) for t in output]
        for i in range(1, len(output)):
            _count_ngrams(self._dynamic, output, i, self.ngram_min, self.ngram_max)

    def _next(self, tail: list[int]) -> int | None:
        prior = None
        if len(tail) >= self.static_n:
            prior = self._static.get(tuple(tail[-self.static_n :]))
        sizes = range(min(self.ngram_max, len(tail)), self.ngram_min - 1, -1)
        for tier, min_samples, min_percent in (
            (self._context, LAX_MIN_SAMPLES, LAX_MIN_PERCENT),
            (self._dynamic, STRICT_MIN_SAMPLES, STRICT_MIN_PERCENT),
        ):
            for n in sizes:
                nexts = tier.get(tuple(tail[-n:]))
                if nexts:
                    token = _pick(nexts, prior, n, min_samples, min_percent)
                    if token is not None:
                        return token
        if prior:
            return _pick(prior, None, self.static_n, STRICT_MIN_SAMPLES, STRICT_MIN_PERCENT)
        return None

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        self._sync(context)
        tail = self._tokens[-max(self.ngram_max, self.static_n) :]
        out: list[int] = []
        while len(out) < draft_length:
            token = self._next(tail)
            if token is None:
                break
            out.append(token)
            tail.append(token)
        return Draft.chain(tuple(out))
