"""Grammars for the tests, and the constrained law worked out without the engine.

constrained_law is the reference the engine is held to under a grammar: at every position the target's
logits with the tokens the grammar forbids there set to -inf, then process_logits (masked and
renormalised), each continuation walked token by token with the engine's numerics (engine_law's: one
fused prefill, one exact step per token). An end-of-answer token ends a continuation, as generate ends.
"""

from __future__ import annotations

import json
from dataclasses import replace

import torch

from specdec.sampling import process_logits
from specdec.sampling.grammar import GrammarState

# a JSON object with forced keys and punctuation and short free parts (a name, a number, a choice, a list)
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 4}, "n": {"type": "integer", "minimum": 0, "maximum": 999},
    "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["x", "yz"]}, "maxItems": 2}},
    "required": ["name", "n", "ok", "tags"], "additionalProperties": False}
SCHEMA_TEXT = json.dumps(SCHEMA)
# text that fits SCHEMA, to put in a prompt: the model-free drafters find it there and draft from it
EXAMPLE = '{"name": "ab", "n": 12, "ok": true, "tags": ["x", "yz"]}'


class BiasedDraftModel:
    """A loaded draft model (specdec.model.load.Model) whose logits get `bias` (V,) added: a random draft model
    knows no JSON, so alone its drafts would all be cut; leaning towards the tokens the constrained target
    emits, it drafts some the grammar allows (accepted or rejected) and some it forbids (cut)."""

    def __init__(self, model, bias: torch.Tensor):
        self.config = model.config
        self.transformer = _BiasedTransformer(model.transformer, bias)


class _BiasedTransformer:
    def __init__(self, inner, bias: torch.Tensor):
        self._inner, self._bias = inner, bias

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def forward(self, *args, **kwargs):
        out = self._inner.forward(*args, **kwargs)
        return replace(out, logits=out.logits + self._bias)


def gbnf_literal(text: str) -> str:
    """text as a GBNF string literal: quotes, backslashes and control characters escaped, the rest as it is
    (UTF-8; llguidance's converter turns a \\u escape into a Lark escape Lark does not read)."""
    out = []
    for c in text:
        out.append("\\" + c if c in '"\\' else f"\\x{ord(c):02X}" if ord(c) < 0x20 else c)
    return '"' + "".join(out) + '"'


def forcing_prefix(text: str, chars: int) -> str:
    """A GBNF grammar of text's first `chars` characters, then any text: a model whose greedy answer is `text`
    writes it under this grammar too (every token of it is allowed), while the grammar drafter drafts the
    forced part."""
    return f"root ::= {gbnf_literal(text[:chars])} [^\\x00]*"


def constrained_law(model, prompt: list[int], sampling, grammar, depth: int) -> dict[tuple[int, ...], float]:
    """P(emitted tokens | prompt) of `depth` tokens (fewer where an end-of-answer token came) under `grammar`
    (a compiled sampling.grammar.Grammar; None: no constraint), sampling: SamplingParams without a grammar."""
    tr = model.transformer
    eos = set(model.tokenizer.eos_ids)
    cache = tr.new_cache(len(prompt) + depth + 1)
    slot = cache.allocate()
    out = tr.forward(torch.tensor([prompt]), cache, [slot], exact=False, last_only=True)
    state = GrammarState(grammar) if grammar is not None else None
    law: dict[tuple[int, ...], float] = {}

    def walk(logits: torch.Tensor, prefix: tuple[int, ...], p: float) -> None:
        if state is not None:
            logits = logits.masked_fill(~state.mask(), float("-inf"))
        probs = process_logits(logits, sampling)  # (V,)
        for t in probs.nonzero().flatten().tolist():
            q = p * float(probs[t])
            if t in eos or len(prefix) + 1 == depth:
                key = prefix if t in eos else prefix + (t,)
                law[key] = law.get(key, 0.0) + q
                continue
            cache.truncate(slot, len(prompt) + len(prefix))
            step = tr.forward(torch.tensor([[t]]), cache, [slot])
            if state is not None:
                state.advance([t])
            walk(step.logits[0, -1], prefix + (t,), q)
            if state is not None:
                state.matcher.rollback(1)

    walk(out.logits[0, -1], (), 1.0)
    return law
