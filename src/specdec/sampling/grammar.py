"""Constrained decoding: a request's grammar, and the state that says which tokens may come next.

The constrained distribution is the target's masked to the tokens the grammar allows and renormalised:
forbidden logits become -inf before process_logits (greedy: the masked argmax). Plain and speculative
decoding apply the same mask at every position they sample or verify, so greedy output is identical
token for token and sampled output keeps the constrained law (docs/design.md, "Constrained decoding").
The grammar engine is llguidance (Microsoft's guidance project): JSON schemas, llama.cpp's GBNF and Lark,
a (V,) mask in 20-70 microseconds on 49k-262k vocabularies, rollback, and the tokens a grammar forces
(docs/measurements/grammar-masks.md: the measurement, beside xgrammar).

    vocab = GrammarVocabulary(token_bytes(tokenizer, V), tokenizer.eos_ids, tokenizer.encode)
    grammar = compile_grammar("json_schema", '{"type": "object"}', vocab)
    state = GrammarState(grammar)
    state.mask()                        # (V,) bool: the tokens that may come next
    kept, masks = state.walk(tokens, parents)   # a draft tree's nodes it allows; the masks after the root and each
    state.advance([t1, t2])             # tokens committed
    state.forced(4)                     # at most 4 tokens the grammar forces next (the grammar drafter's draft)
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import llguidance
import numpy as np
import torch
from llguidance.gbnf_to_lark import any_to_lark

# The kinds of grammar a request may carry: a JSON schema (OpenAI's response_format json_schema, llama.cpp's
# json_schema field), any JSON object (response_format json_object) and llama.cpp's GBNF (Lark too).
KINDS = ("json_schema", "json_object", "gbnf")
# JSON is written on one line with Python's json.dumps separators, so that keys and punctuation are forced
# (the grammar drafter drafts them) and a small model cannot wander into endless whitespace; a schema's own
# "x-guidance" object overrides these (llguidance's JSON options).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarVocabulary:
    """A model's vocabulary as the grammar engine reads it; built once per model (1-5 s for 49k-262k tokens).

    token_bytes: specdec.model.token_bytes.TokenBytes over the model's vocab_size rows; eos_ids: the tokens that
    end an answer (allowed where the grammar is complete); encode(text) -> ids, for the engine's own use.
    """

    def __init__(self, token_bytes, eos_ids: Sequence[int], encode: Callable[[str], list[int]]):
        if not eos_ids:
            raise ValueError("constrained decoding needs an end-of-answer token; this tokenizer names none")
        self.size = len(token_bytes.tokens)
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.tokenizer = llguidance.LLTokenizer(_Wrapper(token_bytes, list(eos_ids), encode), n_vocab=self.size,
                                                eos_token=list(eos_ids))
        self.grammars: OrderedDict = OrderedDict()  # engine.constrain.compile_for's cache: (kind, text) -> Grammar


class _Wrapper:
    """What llguidance.LLTokenizer reads from a tokenizer (its TokenizerWrapper's attributes)."""

    def __init__(self, token_bytes, eos_ids: list[int], encode: Callable[[str], list[int]]):
        self.tokens = list(token_bytes.tokens)
        self.special_token_ids = list(token_bytes.special)
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = None
        self.is_tokenizer_wrapper = True
        self._encode = encode

    def __call__(self, text) -> list[int]:
        return self._encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)


@dataclass(frozen=True)
class Grammar:
    """A grammar compiled for one vocabulary: kind (KINDS), the text it was given, and llguidance's form."""

    kind: str
    text: str
    compiled: str = field(repr=False)
    vocabulary: GrammarVocabulary = field(repr=False, compare=False)


def compile_grammar(kind: str, text: str, vocabulary: GrammarVocabulary) -> Grammar:
    """A Grammar from a JSON schema (text or dict), "" for json_object, or a GBNF / Lark grammar.

    ValueError, one sentence naming what is wrong, for a kind not in KINDS, a schema that is not a JSON object
    or that no value satisfies, and a grammar that does not parse.
    """
    if kind not in KINDS:
        raise ValueError(f"grammar kind {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "gbnf":
        if not isinstance(text, str) or not text.strip():
            raise ValueError("the grammar is empty; give a GBNF grammar with a root rule")
        try:
            compiled = llguidance.LLMatcher.grammar_from_lark(any_to_lark(text))
        except Exception as exc:  # the converter's own errors (GbnfToLarkError, a missing rule)
            raise ValueError(f"the grammar does not parse: {exc}") from None
        what = "the grammar"
    else:
        schema = {"type": "object"} if kind == "json_object" else _schema(text)
        compiled = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        what = "the JSON schema"
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled, vocabulary.tokenizer)
    if failed:
        raise ValueError(f"{what} cannot be used: {messages[0]}")
    text = text if isinstance(text, str) else json.dumps(text)
    return Grammar(kind, text, compiled, vocabulary)


def _schema(text) -> dict:
    if isinstance(text, dict):
        return text
    try:
        schema = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"the JSON schema must be a JSON object, got {type(schema).__name__}")
    return schema


class GrammarState:
    """Where one request stands in its grammar: advanced over committed tokens only; a draft is walked and
    rolled back. Every mask is a (V,) bool tensor, V the model's vocab_size; it always allows something (the
    end-of-answer token once the grammar is complete)."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.matcher = llguidance.LLMatcher(grammar.vocabulary.tokenizer, grammar.compiled, log_level=0)
        self._check()

    def mask(self) -> torch.Tensor:
        """(V,) bool: True where the token may come next."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)  # little-endian 32-bit words
        self._check()
        if not bits.any():  # numpy, one thread: torch's reductions wake its thread pool, ~100x slower under load
            raise RuntimeError("the grammar allows no token here, not even the end of the answer")
        return torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self.grammar.vocabulary.size].view(bool))

    def advance(self, tokens: Sequence[int]) -> None:
        """Commit tokens the grammar allows (RuntimeError for one it forbids: a token was emitted unmasked)."""
        for t in tokens:
            if not self.matcher.consume_token(int(t)):
                raise RuntimeError(f"token {t} was emitted where the grammar forbids it: {self.matcher.get_error()}")

    def forced(self, limit: int) -> list[int]:
        """At most `limit` tokens the grammar forces next (one continuation only, tokenized as the tokenizer
        would); [] where it leaves a choice."""
        return self.matcher.compute_ff_tokens()[:limit] if limit > 0 else []

    def walk(self, tokens: Sequence[int], parents: Sequence[int]) -> tuple[list[int], torch.Tensor]:
        """(kept, masks) for a draft tree (TokenTree's tokens and parents, -1 the last committed token; a chain's
        parents are -1, 0, 1, ...): kept, the nodes whose token the grammar allows after their path (a node under
        a forbidden one goes too), in tree order; masks (1 + len(kept), V): row 0 the mask after the last
        committed token, row 1 + j the mask after kept[j]'s path. An end-of-answer node is kept where its parent's
        mask allows it, is never given to the matcher (llguidance does not roll its stop back) and has no kept
        children; its row allows only the end tokens. The state is as it was afterwards."""
        rows = {-1: self.mask()}
        ended: dict[int, torch.Tensor] = {}  # end-of-answer nodes -> their rows
        kept: list[int] = []
        paths = {-1: []}  # node -> the nodes from the root's first child down to it
        held: list[int] = []  # the nodes whose tokens the matcher holds now, root first
        for i, (token, parent) in enumerate(zip(tokens, parents)):
            if parent not in rows or not bool(rows[parent][token]):
                continue
            if token in self.grammar.vocabulary.eos_ids:
                ended[i] = self._end_row()
                kept.append(i)
                continue
            paths[i] = paths[parent] + [i]
            common = 0
            while common < min(len(held), len(paths[i])) and held[common] == paths[i][common]:
                common += 1
            self._rollback(len(held) - common)
            self.advance([tokens[j] for j in paths[i][common:]])
            held = paths[i]
            rows[i] = self.mask()
            kept.append(i)
        self._rollback(len(held))
        return kept, torch.stack([rows[-1]] + [ended[i] if i in ended else rows[i] for i in kept])

    def _end_row(self) -> torch.Tensor:
        """(V,) bool allowing only the end-of-answer tokens: what may follow the end of the answer."""
        row = torch.zeros(self.grammar.vocabulary.size, dtype=torch.bool)
        row[list(self.grammar.vocabulary.eos_ids)] = True
        return row

    def _rollback(self, n: int) -> None:
        if n and not self.matcher.rollback(n):
            raise RuntimeError(f"the grammar state could not roll back {n} tokens: {self.matcher.get_error()}")

    def _check(self) -> None:
        if self.matcher.is_error():
            raise RuntimeError(f"the grammar engine failed: {self.matcher.get_error()}")
