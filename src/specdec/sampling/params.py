"""Sampling parameters and the one function that turns logits into probabilities.

Target and draft distributions must go through exactly the same processing
(docs/design.md, "Verification"), so every caller uses `process_logits`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from specdec.sampling.grammar import Grammar


def is_whole(value) -> bool:
    """An integer (numpy's too), not a bool: what every count, length and seed must be."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns logits into tokens.

    temperature == 0 means greedy (argmax); no probabilities are involved then.
    top_k == 0, top_p == 1.0 and min_p == 0.0 each mean "off".
    grammar: the tokens may only spell what it allows (sampling/grammar.py); None: no constraint.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):  # "1.0" was a bare TypeError
                raise ValueError(f"{name} must be a number, got {value!r}")
        for name in ("top_k", "seed"):
            value = getattr(self, name)
            if (value is not None or name == "top_k") and not is_whole(value):  # None is seed's "none"
                raise ValueError(f"{name} must be a whole number, got {value!r}")  # 2.5 failed inside torch
        try:  # 10**400 passed the comparison and overflowed inside torch
            finite = 0.0 <= float(self.temperature) < math.inf
        except OverflowError:
            finite = False
        if not finite:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:  # what torch.Generator.manual_seed takes
            raise ValueError(f"seed must be an integer in [-2**63, 2**64), got {self.seed}")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise ValueError(f"grammar must be a compiled Grammar (sampling.grammar.compile_grammar), got "
                             f"{type(self.grammar).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> torch.Generator:
        """A CPU generator seeded from `seed` (or from fresh entropy when seed is None)."""
        gen = torch.Generator()
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(int(self.seed))  # a numpy integer too
        return gen


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p, in float32.

    logits: (..., V). Returns (..., V) rows that sum to 1. Filters apply in the
    order llama.cpp and vLLM use: temperature, top-k, top-p, min-p.
    Greedy params (temperature 0) give the one-hot distribution of the argmax,
    so a verifier can treat greedy as a special case of sampling if it wants.

    >>> process_logits(torch.tensor([0.0, 1.0, 2.0]), SamplingParams(temperature=1.0, top_k=1))
    tensor([0., 0., 1.])
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    # Shifted to max 0 before dividing, and the temperature kept a float32 number (1e-300 is 0 there): a tiny
    # temperature overflowed the logits to inf, or divided 0 by 0, making every row NaN; this way the row
    # tends to the argmax (ties sharing), as the limit does.
    # and at most float32's largest (1e39 became inf there, and -inf / inf NaN in a row with a masked token)
    temperature = min(max(float(params.temperature), torch.finfo(torch.float32).tiny), torch.finfo(torch.float32).max)
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p  # keep the smallest prefix reaching top_p
        drop_sorted[..., 0] = False  # and always the most likely token (a top_p that rounds to 0 in float32)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if params.min_p > 0.0:
        floor = params.min_p * probs.amax(-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id drawn from a (V,) probability row (weights: they need not sum to 1).

    One uniform draw u in [0, total) is inverted through the row's cumulative sums in float64, two
    levels deep: the sums of blocks of SAMPLE_BLOCK tokens pick the block u falls in, the cumulative
    sum inside that block the token, the first whose sum passes u. Token i is drawn with probability
    probs[i] / total (to float64 rounding), a zero-probability token never (its cumulative sum equals
    its predecessor's). torch.multinomial took 3.1 ms for qwen2.5-coder-1.5b's 151936 tokens on a
    2-core EPYC, ~10% of a sampled decoding step, and one float64 cumsum over the row 0.9 ms.
    Raises ValueError for a row without positive mass, or with a negative, NaN or inf entry.
    """
    return _draw(probs, generator)


def sample_tokens(probs: torch.Tensor, k: int, generator: torch.Generator) -> list[int]:
    """k distinct token ids drawn in order from a (V,) row without replacement (torch.multinomial's
    law): each draw as sample_token's over the weights the earlier draws left. Needs k positive
    weights (ValueError otherwise)."""
    weights = probs.clone()
    drawn = []
    for _ in range(k):
        drawn.append(_draw(weights, generator))
        weights[drawn[-1]] = 0.0
    return drawn


SAMPLE_BLOCK = 1024


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    # sample_token's one random draw, a function of its own so that tests/helpers/branches.py can
    # enumerate it
    n = probs.shape[0]
    full = n // SAMPLE_BLOCK * SAMPLE_BLOCK
    sums = probs[:full].reshape(-1, SAMPLE_BLOCK).sum(1, dtype=torch.float64)
    if full < n:
        sums = torch.cat([sums, probs[full:].sum(0, dtype=torch.float64).reshape(1)])
    ends = torch.cumsum(sums, 0)
    total, least = float(ends[-1]), float(probs.min())
    if not (0.0 < total < float("inf") and least >= 0.0):
        raise ValueError(f"cannot sample from a row whose probabilities sum to {total} (the least {least})")
    u = torch.rand((), generator=generator, dtype=torch.float64, device=generator.device) * total
    b = _first_above(ends, u)
    start = b * SAMPLE_BLOCK
    inside = torch.cumsum(probs[start:start + SAMPLE_BLOCK], 0, dtype=torch.float64)
    return start + _first_above(inside, u - (ends[b - 1] if b else 0.0))


def _first_above(cumulative: torch.Tensor, u: torch.Tensor) -> int:
    """The first index whose cumulative sum is above u; where rounding left u at or above the last
    one, the first index that reaches the last (the last with positive weight)."""
    i = int(torch.searchsorted(cumulative, u, right=True))
    if i == cumulative.shape[0]:
        i = int(torch.searchsorted(cumulative, cumulative[-1]))
    return i
