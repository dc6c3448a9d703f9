"""SentencePiece tokenizers from GGUF metadata (`tokenizer.ggml.model` = "llama": Llama 2, Mistral, Gemma).

The algorithm is SentencePiece's BPE encoder (bpe_model.cc), which llama.cpp's llm_tokenizer_spm
repeats: split the text into characters, then keep merging the adjacent pair whose concatenation is
a vocabulary piece with the highest score (equal scores: the leftmost pair). A character the
vocabulary lacks becomes its UTF-8 bytes, as <0xNN> tokens. Example, with scores
{"▁t": -1, "he": -2, "▁the": -3}: "▁the" -> ▁ t h e -> ▁t h e -> ▁t he -> ▁the.

It runs inside a `tokenizers` pipeline, so `Tokenizer` keeps one backend for every vocabulary:
  1. added tokens, matched whole in the raw text (leftmost, longest): control and unknown tokens
     as special ones (<start_of_turn>), user-defined ones as plain ones (Gemma's "\n\n", "<b>",
     runs of spaces; the GGUF converter already spelled their "▁" as spaces);
  2. each remaining stretch of text: prepend "▁" when add_space_prefix, then " " -> "▁"
     (llama.cpp prefixes every stretch, the one after a special token too);
  3. this module's merge loop, as a pre-tokenizer, cuts the stretch into its final pieces;
  4. a BPE model with no merges (ignore_merges) maps each piece to its id, or an unknown
     character to its byte tokens (byte_fallback);
  5. decoding: "▁" -> " ", byte tokens -> bytes (UTF-8 assembled), one leading space dropped
     when add_space_prefix.

Why not a BPE merge table derived from the scores, as transformers' GGUF converter builds: the loop
here is SentencePiece's own definition, so parity needs no argument about rank orders, and it
builds in about a second for Gemma's 262k pieces (the converter takes ~40 s). The converter also
respells Gemma's space-run tokens as "▁" pieces and merges them like ordinary ones, so it cuts a run
of more than 31 spaces differently from SentencePiece and llama.cpp (16 + 19 instead of 31 + 4).
"""

from __future__ import annotations

import heapq

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_MERGEABLE = (0, NORMAL, USER_DEFINED, UNUSED)  # SentencePiece's `pieces_`: what a merge may produce; 0 = untyped


class SpmMerger:
    """The SentencePiece BPE merge loop over a vocabulary of scored pieces.

    scores: piece -> score, for the pieces a merge may produce (normal, user-defined, unused).
    unused: pieces that are merged through but never emitted; SentencePiece splits them back
    into the two pieces they were made of (its "resegment").
    """

    CACHE_SIZE = 1 << 16  # chunks remembered (a chunk is mostly one word)

    def __init__(self, scores: dict[str, float], unused: frozenset[str] = frozenset()):
        self.scores = scores
        self.unused = unused
        # Two adjacent characters can end up in one piece only if some piece contains them side by side.
        # Where none does, no merge ever crosses, so the text splits there into chunks that merge alone
        # (in the same order as together) and can be cached. Unused pieces keep the whole text together:
        # SentencePiece remembers their splits across it.
        self.crossable = {p[i : i + 2] for p in scores for i in range(len(p) - 1)}
        self.cache: dict[str, list[str]] = {}

    def pieces(self, text: str) -> list[str]:
        """The final pieces of one stretch of (already "▁"-escaped) text.

        >>> SpmMerger({"▁t": -1.0, "he": -2.0, "▁the": -3.0}).pieces("▁the▁he")
        ['▁the', '▁', 'he']
        """
        if self.unused:
            return self._merge(text)
        out: list[str] = []
        start, crossable = 0, self.crossable
        for i in range(1, len(text)):
            if text[i - 1 : i + 1] not in crossable:
                out += self._cached(text[start:i])
                start = i
        return out + self._cached(text[start:]) if text else out

    def _cached(self, chunk: str) -> list[str]:
        found = self.cache.get(chunk)
        if found is None:
            if len(self.cache) >= self.CACHE_SIZE:
                self.cache.clear()
            found = self.cache[chunk] = self._merge(chunk)
        return found

    def _merge(self, text: str) -> list[str]:
        n = len(text)
        if n < 2:
            return [text] if text else []
        score = self.scores.get
        # Symbol i covers text[i:end[i]]; symbols form a linked list (nxt, prv); nxt = -2 marks a symbol
        # merged into its left neighbour.
        end = list(range(1, n + 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        rev_merge: dict[str, tuple[str, str]] = {}
        # Heap entries: (-score, left, right, size); the smallest is the best pair, leftmost on ties.
        heap = []
        for i in range(n - 1):
            s = score(text[i : i + 2])
            if s is not None:
                heap.append((-s, i, i + 1, 2))
        heapq.heapify(heap)

        def add(left: int, right: int) -> None:
            piece = text[left : end[right]]
            s = score(piece)
            if s is not None:
                heapq.heappush(heap, (-s, left, right, len(piece)))
                if piece in self.unused:
                    rev_merge[piece] = (text[left : end[left]], text[right : end[right]])

        if self.unused:
            for i in range(n - 1):
                if text[i : i + 2] in self.unused:
                    rev_merge[text[i : i + 2]] = (text[i], text[i + 1])
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if nxt[left] != right or end[right] - left != size:
                continue  # stale: one side has been merged since this pair was queued
            end[left] = end[right]
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            nxt[right] = -2
            if prv[left] >= 0:
                add(prv[left], left)
            if nxt[left] >= 0:
                add(left, nxt[left])
        out: list[str] = []
        i = 0
        while i >= 0:
            self._emit(text[i : end[i]], rev_merge, out)
            i = nxt[i]
        return out

    def _emit(self, piece: str, rev_merge: dict, out: list[str]) -> None:
        if piece in self.unused and piece in rev_merge:
            left, right = rev_merge[piece]
            self._emit(left, rev_merge, out)
            self._emit(right, rev_merge, out)
        else:
            out.append(piece)


class _SpmPreTokenizer:
    """Adapter: the merge loop as a `tokenizers` custom pre-tokenizer."""

    def __init__(self, merger: SpmMerger):
        self.merger = merger

    def _split(self, _index, normalized):
        spans, start = [], 0
        for piece in self.merger.pieces(str(normalized)):
            spans.append(normalized[start : start + len(piece)])
            start += len(piece)
        return spans

    def pre_tokenize(self, pretok) -> None:
        pretok.split(self._split)


def spm_backend(tokens: list[str], scores: list[float], types: list[int], add_space_prefix: bool,
                unk_id: int | None):
    """A `tokenizers.Tokenizer` that encodes and decodes like SentencePiece / llama.cpp (see the module doc)."""
    types = list(types) if len(types) else [NORMAL] * len(tokens)
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicate spelling keeps its first id, as llama.cpp's text_to_token does
    mergeable = {t: float(s) for t, s, ty in zip(tokens, scores, types) if ty in _MERGEABLE}
    unused = frozenset(t for t, ty in zip(tokens, types) if ty == UNUSED)
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    backend = Backend(models.BPE(vocab=vocab, merges=[], unk_token=unk, byte_fallback=True, fuse_unk=True,
                                 ignore_merges=True))
    escape = [normalizers.Replace(" ", "\u2581")]
    backend.normalizer = normalizers.Sequence(([normalizers.Prepend("\u2581")] if add_space_prefix else []) + escape)
    backend.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(_SpmPreTokenizer(SpmMerger(mergeable, unused)))
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, ty in zip(tokens, types) if ty in (CONTROL, UNKNOWN)])
    backend.add_tokens([AddedToken(t, normalized=False, special=False)
                        for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    return backend
