"""Toy models and the two lossless checks shared by the tests of specdec.verify.

Lossless sampling is checked two ways on a 4-token vocabulary:
- exactly: `Branches` (tests/helpers/branches.py) replaces the two random draws in
  specdec.verify.draws (and the test's own draft sampling) by branch points and replays
  the real verifier once per branch, so the law of the emitted tokens is computed exactly
  and compared with the target's;
- statistically: seeded chi-square tests of the real functions with real generators.
Both checks are also run on deliberately broken verifiers (test_enumeration.py), which
they must reject.

Not a conftest.py: tests/conftest.py is imported as `conftest` by other tests.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Callable

import torch
from scipy.stats import chisquare

from specdec.sampling.params import SamplingParams, process_logits
from specdec.verify import TokenTree, VerifyResult, chain, draws, tree, verify_sampling, verify_tree_sampling

VOCAB = 4
PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7-topk3": SamplingParams(temperature=0.7, top_k=3),
    "t1.3-topp0.8": SamplingParams(temperature=1.3, top_p=0.8),
}
# Tree shapes: {rank path of a node: number of children}; () is the root, (0,) its first child.
SHAPES = {
    "2x2": {(): 2, (0,): 2, (1,): 1},
    "3x1": {(): 3, (0,): 1},
}
UNUSED = torch.Generator()  # the generator argument while Branches replaces the draws


class ToyModel:
    """A made-up language model: a fixed random processed distribution after every prefix."""

    def __init__(self, seed: int, params: SamplingParams, dtype: torch.dtype = torch.float64):
        self.seed, self.params, self.dtype = seed, params, dtype
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}
        self._lists: dict[tuple[int, ...], list[float]] = {}

    def probs(self, prefix) -> torch.Tensor:
        """(V,) probabilities of the next token after `prefix` (tokens after the context)."""
        prefix = tuple(prefix)
        if prefix not in self._rows:
            gen = torch.Generator().manual_seed(hash((self.seed,) + prefix) & 0x7FFFFFFF)
            logits = torch.randn(VOCAB, generator=gen)  # (V,)
            row = process_logits(logits, self.params).double()
            self._rows[prefix] = (row / row.sum()).to(self.dtype)
            self._lists[prefix] = self._rows[prefix].tolist()
        return self._rows[prefix]

    def weights(self, prefix) -> list[float]:
        """probs(prefix) as a list, for the test's own (fast) sampling."""
        self.probs(prefix)
        return self._lists[tuple(prefix)]


def models(params_name: str, dtype=torch.float64) -> tuple[ToyModel, ToyModel]:
    """(target, drafter) sharing the same processing, as docs/design.md ("Verification") requires."""
    return ToyModel(5, PARAMS[params_name], dtype), ToyModel(6, PARAMS[params_name], dtype)


# ---- one speculative step on toy models; `draw(weights)` samples the drafter's tokens ----


def chain_step(target, drafter, k, sampled, draw, generator=UNUSED) -> VerifyResult:
    """Draft k tokens (sampled from the drafter, or its argmax when not `sampled`) and verify."""
    tokens, rows = [], []
    for _ in range(k):
        q = drafter.probs(tokens)  # (V,)
        tokens.append(draw(drafter.weights(tokens)) if sampled else int(q.argmax()))
        rows.append(q)
    target_probs = torch.stack([target.probs(tokens[:i]) for i in range(k + 1)])  # (k+1, V)
    result = verify_sampling(target_probs, tokens, torch.stack(rows) if sampled else None, generator)
    assert len(result.tokens) == result.num_accepted + 1
    assert result.tokens[:-1] == tuple(tokens[: result.num_accepted])
    assert result.accepted_path == tuple(range(result.num_accepted)) and not result.lossy
    return result


def tree_step(target, drafter, shape, sampled, draw, generator=UNUSED) -> VerifyResult:
    """Draft a tree of `shape` (siblings sampled without replacement, or the drafter's
    top-k when not `sampled`) and verify it."""
    tokens, parents, rows = [], [], []
    node_of = {(): -1}  # rank path -> node index
    prefix_of = {-1: ()}  # node index -> tokens from the root down to it
    for rank_path, count in shape.items():
        if rank_path not in node_of:  # the support ran out of distinct siblings
            continue
        parent = node_of[rank_path]
        q = drafter.probs(prefix_of[parent])  # (V,)
        if sampled:
            left, siblings = list(drafter.weights(prefix_of[parent])), []
            while len(siblings) < count and sum(left) > 0:
                siblings.append(draw([w / sum(left) for w in left]))
                left[siblings[-1]] = 0.0
        else:
            siblings = q.topk(count).indices.tolist()
        for rank, token in enumerate(siblings):
            node_of[rank_path + (rank,)] = len(tokens)
            prefix_of[len(tokens)] = prefix_of[parent] + (token,)
            tokens.append(token)
            parents.append(parent)
            rows.append(q)
    draft_tree = TokenTree(tuple(tokens), tuple(parents))
    target_probs = torch.stack([target.probs(prefix_of[i]) for i in range(-1, len(tokens))])  # (n+1, V)
    result = verify_tree_sampling(target_probs, draft_tree, torch.stack(rows) if sampled else None, generator)
    assert len(result.tokens) == result.num_accepted + 1 == len(result.accepted_path) + 1
    for depth, node in enumerate(result.accepted_path):
        assert draft_tree.parents[node] == (result.accepted_path[depth - 1] if depth else -1)
        assert result.tokens[depth] == tokens[node]
    return result


def continue_with_target(weighted, target, length) -> dict[tuple[int, ...], float]:
    """Law of the first `length` tokens when plain target sampling follows each sequence."""
    out: dict[tuple[int, ...], float] = defaultdict(float)
    stack = [(tuple(seq[:length]), w) for seq, w in weighted]
    while stack:
        seq, w = stack.pop()
        if len(seq) == length:
            out[seq] += w
            continue
        stack.extend((seq + (t,), w * p) for t, p in enumerate(target.probs(seq).tolist()) if p > 0)
    return dict(out)


def gap_to_target(results: dict[VerifyResult, float], target, length) -> float:
    """Largest difference between the emitted law of `length` tokens and the target's."""
    emitted = continue_with_target([(r.tokens, w) for r, w in results.items()], target, length)
    wanted = continue_with_target([((), 1.0)], target, length)
    return max(abs(emitted.get(s, 0.0) - wanted.get(s, 0.0)) for s in emitted.keys() | wanted.keys())


# ---- verifiers broken on purpose, which both checks must reject ----

BROKEN = {
    "accept-always": lambda mp: mp.setattr(draws, "accept", lambda probability, generator=None: True),
    "recover-from-target": lambda mp: (
        mp.setattr(chain, "residual_probs", lambda target_probs, draft_probs: target_probs),
        mp.setattr(tree, "residual_probs", lambda target_probs, draft_probs: target_probs),
    ),
    "siblings-with-replacement": lambda mp: mp.setattr(tree, "without_tokens", lambda probs, tokens: probs),
    # a deterministic draft is verified by the target's own draws (no residual): break those
    "draws-from-flattened-rows": lambda mp: _flatten_draws(mp),
}


def _flatten_draws(mp) -> None:
    """Every draw a verifier makes reads sqrt(row), renormalized: a row processed wrongly."""
    inner = draws.sample
    mp.setattr(draws, "sample", lambda probs, generator=None: inner(probs.sqrt() / probs.sqrt().sum(), generator))


# ---- Monte Carlo with the real generators ----

SAMPLES = 5_000  # per test; the exact (Branches) tests are the precise ones


def chi_square_p_value(step: Callable[[torch.Generator, Callable], VerifyResult], target) -> float:
    """p-value of the first two emitted tokens (continued by plain sampling) vs the target.

    The verifier draws from a seeded torch.Generator; drafting and the continuation use
    a seeded random.Random (much faster than torch for 4 tokens). 0.0 when a pair the
    target cannot produce is emitted.
    """
    verify_gen, rng = torch.Generator().manual_seed(1234), random.Random(5678)
    draw = lambda weights: rng.choices(range(VOCAB), weights)[0]  # noqa: E731
    wanted = continue_with_target([((), 1.0)], target, 2)
    counts: dict[tuple[int, ...], int] = defaultdict(int)
    for _ in range(SAMPLES):
        tokens = step(verify_gen, draw).tokens[:2]
        if len(tokens) < 2:
            tokens += (draw(target.weights(tokens)),)
        if tokens not in wanted:
            return 0.0
        counts[tokens] += 1
    cells = sorted(wanted)
    expected = [SAMPLES * wanted[c] for c in cells]
    expected = [e * SAMPLES / sum(expected) for e in expected]  # exact total for scipy
    return chisquare([counts.get(c, 0) for c in cells], expected).pvalue


MC_STEPS = {  # name: (params, chain or tree shape, sampled draft?)
    "chain-k3-draft-probs": ("t1.3-topp0.8", 3, True),
    "chain-k2-one-hot": ("t1", 2, False),
    "tree-draft-probs": ("t1", "2x2", True),
    "tree-one-hot": ("t0.7-topk3", "3x1", False),
}


def mc_step(name: str):
    """(target, step(verify generator, draw)) for one MC_STEPS entry, in float32 like process_logits."""
    params_name, size, sampled = MC_STEPS[name]
    target, drafter = models(params_name, torch.float32)
    if isinstance(size, int):
        return target, lambda gen, draw: chain_step(target, drafter, size, sampled, draw, gen)
    return target, lambda gen, draw: tree_step(target, drafter, SHAPES[size], sampled, draw, gen)


# ---- greedy ----


def rows_with_argmax(*argmaxes: int, vocab: int = 6) -> torch.Tensor:
    """(len(argmaxes), vocab) logits whose row i has its maximum at argmaxes[i]."""
    logits = torch.zeros(len(argmaxes), vocab)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return logits
