"""Tests for specdec.verify.

Lossless sampling is checked two ways on a 4-token vocabulary:
- exactly: `Branches` replaces the two random draws in specdec.verify.draws (and the
  test's own draft sampling) by branch points and replays the real verifier once per
  branch, so the law of the emitted tokens is computed exactly and compared with the
  target's;
- statistically: seeded chi-square tests of the real functions with real generators.
Both checks are also run on deliberately broken verifiers, which they must reject.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Callable

import pytest
import torch
from scipy.stats import chisquare

from specdec.drafters.base import TokenTree
from specdec.sampling.params import SamplingParams, process_logits, sample_token
from specdec.verify import (
    VerifyResult,
    chain,
    draws,
    tree,
    verify_greedy,
    verify_sampling,
    verify_tree_greedy,
    verify_tree_sampling,
    verify_typical,
)

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
    """(target, drafter) sharing the same processing, as DESIGN.md requires."""
    return ToyModel(5, PARAMS[params_name], dtype), ToyModel(6, PARAMS[params_name], dtype)


class Branches:
    """Exact enumeration of every random draw of a program.

    Installed with monkeypatch, draws.accept and draws.sample become branch points.
    distribution(program) replays the program once per combination of outcomes and
    returns {outcome: exact probability}.
    """

    def __init__(self, monkeypatch):
        self._choose: Callable = lambda options: pytest.fail("draw outside distribution()")
        monkeypatch.setattr(draws, "accept", self.accept)
        monkeypatch.setattr(draws, "sample", self.sample)

    def accept(self, probability: float, generator=None) -> bool:
        p = min(max(probability, 0.0), 1.0)
        return self._choose([(True, p), (False, 1.0 - p)])

    def sample(self, probs: torch.Tensor, generator=None) -> int:
        return self._choose(list(enumerate(probs.tolist())))

    def draw(self, weights: list[float]) -> int:
        """The test's own draft sampling, from normalized weights."""
        return self._choose(list(enumerate(weights)))

    def distribution(self, program: Callable[[], object]) -> dict[object, float]:
        dist: dict[object, float] = defaultdict(float)
        pending: list[tuple[int, ...]] = [()]  # choice scripts still to replay
        while pending:
            script = pending.pop()
            path: list[int] = []
            weight = [1.0]

            def choose(options):
                options = [(value, w) for value, w in options if w > 0]
                if len(path) < len(script):
                    pick = script[len(path)]
                else:
                    pick = 0
                    pending.extend(tuple(path) + (alt,) for alt in range(1, len(options)))
                path.append(pick)
                weight[0] *= options[pick][1]
                return options[pick][0]

            self._choose = choose
            dist[program()] += weight[0]
        assert abs(sum(dist.values()) - 1.0) < 1e-9
        return dict(dist)


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


# ---- exact distributions ----


@pytest.mark.parametrize("params_name", PARAMS)
@pytest.mark.parametrize("sampled", [True, False], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_chain_sampling_is_exactly_the_target(monkeypatch, k, sampled, params_name):
    branches = Branches(monkeypatch)
    target, drafter = models(params_name)
    results = branches.distribution(lambda: chain_step(target, drafter, k, sampled, branches.draw))
    assert gap_to_target(results, target, 1) < 1e-9  # first token
    assert gap_to_target(results, target, 2) < 1e-9  # first two tokens
    assert gap_to_target(results, target, k + 1) < 1e-9  # everything one step can emit
    # The draft is used well, not only losslessly: the first draft is kept with
    # probability sum(min(target, draft)) (one-hot: target_probs[x]).
    kept = sum(w for r, w in results.items() if r.num_accepted >= 1)
    q = drafter.probs(()) if sampled else torch.nn.functional.one_hot(drafter.probs(()).argmax(), VOCAB)
    assert kept == pytest.approx(float(torch.minimum(target.probs(()), q).sum()), abs=1e-9)


@pytest.mark.parametrize("params_name", PARAMS)
@pytest.mark.parametrize("sampled", [True, False], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("shape", SHAPES)
def test_tree_sampling_is_exactly_the_target(monkeypatch, shape, sampled, params_name):
    branches = Branches(monkeypatch)
    target, drafter = models(params_name)
    results = branches.distribution(lambda: tree_step(target, drafter, SHAPES[shape], sampled, branches.draw))
    assert gap_to_target(results, target, 1) < 1e-9
    assert gap_to_target(results, target, 2) < 1e-9
    assert gap_to_target(results, target, 3) < 1e-9
    if params_name == "t1":  # full support: later siblings do get tried and kept
        assert sum(w for r, w in results.items() if r.accepted_path[:1] == (1,)) > 1e-3


def test_one_hot_draft_probs_rows_match_none(monkeypatch):
    """draft_probs given as explicit one-hot rows is the same algorithm as None."""
    branches = Branches(monkeypatch)
    target, _ = models("t1")
    tokens = [2, 0]
    target_probs = torch.stack([target.probs(tokens[:i]) for i in range(3)])  # (3, V)
    one_hot_rows = torch.nn.functional.one_hot(torch.tensor(tokens), VOCAB).double()  # (2, V)
    with_none = branches.distribution(lambda: verify_sampling(target_probs, tokens, None, UNUSED))
    with_rows = branches.distribution(lambda: verify_sampling(target_probs, tokens, one_hot_rows, UNUSED))
    assert with_none.keys() == with_rows.keys()
    assert all(with_none[r] == pytest.approx(with_rows[r], abs=1e-12) for r in with_none)


def test_tree_rows_may_already_exclude_earlier_siblings(monkeypatch):
    """Row i may be the parent's distribution or the law of node i given its earlier
    siblings; both describe the same draft, so the verifier's law must be the same."""
    branches = Branches(monkeypatch)
    target, drafter = models("t1")
    draft_tree = TokenTree((2, 0, 3), (-1, -1, -1))
    target_probs = torch.stack([target.probs(())] + [target.probs((t,)) for t in draft_tree.tokens])  # (4, V)
    parent_rows = drafter.probs(()).repeat(3, 1)  # (3, V)
    conditioned = parent_rows.clone()
    conditioned[1:, 2] = 0.0
    conditioned[2:, 0] = 0.0
    conditioned /= conditioned.sum(-1, keepdim=True)
    laws = [
        branches.distribution(lambda: verify_tree_sampling(target_probs, draft_tree, rows, UNUSED))
        for rows in (parent_rows, conditioned)
    ]
    assert laws[0].keys() == laws[1].keys() and len(laws[0]) > 4
    assert all(laws[0][r] == pytest.approx(laws[1][r], abs=1e-12) for r in laws[0])


BROKEN = {
    "accept-always": lambda mp: mp.setattr(draws, "accept", lambda probability, generator=None: True),
    "recover-from-target": lambda mp: (
        mp.setattr(chain, "residual_probs", lambda target_probs, draft_probs: target_probs),
        mp.setattr(tree, "residual_probs", lambda target_probs, draft_probs: target_probs),
    ),
    "siblings-with-replacement": lambda mp: mp.setattr(tree, "without_tokens", lambda probs, tokens: probs),
}


@pytest.mark.parametrize(
    "broken, step",
    [
        ("accept-always", "chain"),
        ("recover-from-target", "chain"),
        ("accept-always", "tree-3x1"),
        ("recover-from-target", "tree-3x1-one-hot"),
        ("recover-from-target", "tree-2x2-one-hot"),
        ("siblings-with-replacement", "tree-3x1"),
        ("siblings-with-replacement", "tree-2x2"),
    ],
)
def test_exact_check_rejects_a_broken_verifier(monkeypatch, broken, step):
    branches = Branches(monkeypatch)
    BROKEN[broken](monkeypatch)
    target, drafter = models("t1")
    if step == "chain":
        program = lambda: chain_step(target, drafter, 2, True, branches.draw)  # noqa: E731
    else:
        shape, sampled = SHAPES[step.split("-")[1]], not step.endswith("one-hot")
        program = lambda: tree_step(target, drafter, shape, sampled, branches.draw)  # noqa: E731
    assert gap_to_target(branches.distribution(program), target, 2) > 1e-3


# ---- Monte Carlo with the real generators ----

SAMPLES = 5_000  # per test; the exact tests above are the precise ones


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


@pytest.mark.parametrize("name", MC_STEPS)
def test_chi_square_real_generator(name):
    target, step = mc_step(name)
    assert chi_square_p_value(step, target) > 1e-3


@pytest.mark.parametrize(
    "broken, name", [("accept-always", "chain-k3-draft-probs"), ("recover-from-target", "chain-k2-one-hot")]
)
def test_chi_square_rejects_a_broken_verifier(monkeypatch, broken, name):
    BROKEN[broken](monkeypatch)
    target, step = mc_step(name)
    assert chi_square_p_value(step, target) < 1e-3


# ---- sampling edge cases ----


def test_forced_rejection_with_equal_rows_falls_back_to_the_target(monkeypatch):
    """target == draft leaves an all-zero residual; a (numerically) forced rejection
    must still emit a token from target_probs."""
    monkeypatch.setattr(draws, "accept", lambda probability, generator=None: False)
    row = torch.tensor([0.0, 0.5, 0.5, 0.0])
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        result = verify_sampling(torch.stack([row, row]), [1], row[None], gen)
        assert result.num_accepted == 0 and result.tokens[0] in (1, 2)


def test_one_hot_tree_allows_repeated_sibling_tokens():
    """A deterministic draft may repeat a token among siblings; the repeat is never kept."""
    gen = torch.Generator().manual_seed(0)
    target_probs = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 3)  # (3, V)
    for _ in range(20):
        result = verify_tree_sampling(target_probs, TokenTree((1, 1), (-1, -1)), None, gen)
        assert result.accepted_path in ((), (0,))


def test_sampling_with_one_hot_target_is_greedy():
    """Greedy params make target_probs one-hot; sampling verification then equals greedy."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        logits = torch.randn(4, 6, generator=gen)  # (k+1, V)
        draft = torch.randint(0, 6, (3,), generator=gen).tolist()
        if trial % 2:
            draft[:2] = logits[:2].argmax(-1).tolist()
        target_probs = process_logits(logits, SamplingParams(temperature=0.0))
        assert verify_sampling(target_probs, draft, None, gen) == verify_greedy(logits, draft)


# ---- greedy ----


def rows_with_argmax(*argmaxes: int, vocab: int = 6) -> torch.Tensor:
    """(len(argmaxes), vocab) logits whose row i has its maximum at argmaxes[i]."""
    logits = torch.zeros(len(argmaxes), vocab)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return logits


def test_greedy_all_accepted_emits_bonus():
    assert verify_greedy(rows_with_argmax(2, 0, 1, 3), [2, 0, 1]) == VerifyResult(3, (2, 0, 1, 3), (0, 1, 2))


def test_greedy_first_rejection_emits_recovered():
    assert verify_greedy(rows_with_argmax(2, 4, 1, 3), [2, 0, 1]) == VerifyResult(1, (2, 4), (0,))
    assert verify_greedy(rows_with_argmax(5, 0, 1, 3), [2, 0, 1]) == VerifyResult(0, (5,), ())


def test_greedy_empty_draft_and_ties():
    assert verify_greedy(rows_with_argmax(4), []) == VerifyResult(0, (4,), ())
    tie = torch.tensor([[0.0, 3.0, 3.0, 1.0], [1.0, 1.0, 0.0, 0.0]])  # argmax 1 (first max), then 0
    assert verify_greedy(tie, [2]) == VerifyResult(0, (1,), ())
    assert verify_greedy(tie, [1]) == VerifyResult(1, (1, 0), (0,))


def test_tree_greedy_picks_the_matching_sibling():
    # root -> {5, 7}; 5 -> {1}; 7 -> {2, 3}
    draft_tree = TokenTree(tokens=(5, 7, 1, 2, 3), parents=(-1, -1, 0, 1, 1))
    logits = rows_with_argmax(7, 1, 3, 0, 4, 2, vocab=8)  # rows: root, node 0..4
    assert verify_tree_greedy(logits, draft_tree) == VerifyResult(2, (7, 3, 2), (1, 4))
    logits = rows_with_argmax(7, 1, 6, 0, 4, 2, vocab=8)  # no child of node 1 matches 6
    assert verify_tree_greedy(logits, draft_tree) == VerifyResult(1, (7, 6), (1,))
    logits = rows_with_argmax(0, 1, 6, 0, 4, 2, vocab=8)
    assert verify_tree_greedy(logits, draft_tree) == VerifyResult(0, (0,), ())
    assert verify_tree_greedy(rows_with_argmax(3), TokenTree((), ())) == VerifyResult(0, (3,), ())
    twins = TokenTree((7, 7), (-1, -1))  # the first of equal siblings wins
    assert verify_tree_greedy(rows_with_argmax(7, 1, 2, vocab=8), twins) == VerifyResult(1, (7, 1), (0,))


def test_speculative_greedy_equals_plain_greedy():
    """Chain and tree greedy verification reproduce plain greedy decoding, ties included."""
    gen = torch.Generator().manual_seed(7)
    table: dict[tuple[int, ...], torch.Tensor] = {}

    def logits_after(seq):  # (V,) small integers, so ties are common
        return table.setdefault(tuple(seq), torch.randint(0, 3, (5,), generator=gen).float())

    plain: list[int] = []
    while len(plain) < 30:
        plain.append(int(logits_after(plain).argmax()))
    for use_tree in (False, True):
        out: list[int] = []
        while len(out) < 30:
            guess = plain[len(out): len(out) + 3]
            draft = [t if torch.rand((), generator=gen) < 0.7 else (t + 1) % 5 for t in guess]
            if use_tree:  # the draft as the second sibling of a wrong first one
                parents = (-1, -1) + tuple(range(1, len(draft)))
                draft_tree = TokenTree(((draft[0] + 2) % 5,) + tuple(draft), parents)
                paths = [[]] + [[draft_tree.tokens[i] for i in draft_tree.ancestors(n)]
                                for n in range(len(draft_tree))]
                result = verify_tree_greedy(torch.stack([logits_after(out + p) for p in paths]), draft_tree)
            else:
                rows = [logits_after(out + draft[:i]) for i in range(len(draft) + 1)]
                result = verify_greedy(torch.stack(rows), draft)
            out.extend(result.tokens)
        assert out[:30] == plain


# ---- typical acceptance (lossy) ----


def test_typical_acceptance_thresholds():
    uniform = torch.full((VOCAB,), 0.25)  # threshold min(0.09, 0.3 * 0.25) = 0.075 < 0.25
    peaked = torch.tensor([0.91, 0.03, 0.03, 0.03])  # threshold 0.09 > 0.03
    result = verify_typical(torch.stack([uniform, peaked, uniform]), [3, 2])
    assert result == VerifyResult(1, (3, 0), (0,), lossy=True)
    result = verify_typical(torch.stack([uniform, peaked, peaked]), [3, 0])
    assert result == VerifyResult(2, (3, 0, 0), (0, 1), lossy=True)
    # For a flat row alpha * exp(-H) is the binding term: 0.06 < 0.09 is kept by default
    # (threshold 0.3 * exp(-2.06) = 0.038) but not with alpha = 0.5 (threshold 0.064).
    flat = torch.tensor([0.06] + [0.94 / 7] * 7)  # (8,)
    assert verify_typical(torch.stack([flat, flat]), [0]).num_accepted == 1
    assert verify_typical(torch.stack([flat, flat]), [0], posterior_alpha=0.5).num_accepted == 0


# ---- errors people see ----

ROWS3 = torch.full((3, VOCAB), 0.25)
CHAIN = TokenTree.chain([1, 2])
TWINS = TokenTree((1, 1), (-1, -1))  # two siblings with the same token
HALF = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 2)  # draft rows that cannot produce token 2
SHAPE = r"must have shape \(len\("
ERRORS = [  # (call, expected message)
    (lambda: verify_greedy(ROWS3[:2], [1, 2]),
     r"target_logits must have shape \(len\(draft_tokens\) \+ 1, V\) = \(3, V\), got \(2, 4\)\."),
    (lambda: verify_greedy(ROWS3[0], []), r"target_logits " + SHAPE),
    (lambda: verify_greedy(ROWS3, [1, 9]), r"draft_tokens\[1\] = 9 is outside the target vocabulary \[0, 4\)"),
    (lambda: verify_sampling(ROWS3, [1, 2], ROWS3, UNUSED),
     r"draft_probs must have shape \(len\(draft_tokens\), V\) = \(2, 4\), got \(3, 4\)"),
    (lambda: verify_sampling(ROWS3, [1, 2], torch.full((2, 5), 0.2), UNUSED), r"draft_probs .*, got \(2, 5\)"),
    (lambda: verify_sampling(ROWS3, [1, 2], HALF, UNUSED), r"draft_probs\[1, 2\] is 0, so the drafter could not"),
    (lambda: verify_typical(ROWS3, [1]), r"target_probs must have shape \(len\(draft_tokens\) \+ 1, V\) = \(2, V\)"),
    (lambda: verify_tree_greedy(ROWS3[:2], CHAIN), r"target_logits must have shape \(len\(tree\) \+ 1, V\)"),
    (lambda: verify_tree_greedy(ROWS3, TokenTree.chain([1, 7])), r"tree.tokens\[1\] = 7 is outside"),
    (lambda: verify_tree_sampling(ROWS3[:2], CHAIN, None, UNUSED), r"target_probs " + SHAPE),
    (lambda: verify_tree_sampling(ROWS3, CHAIN, ROWS3, UNUSED), r"draft_probs must have shape \(len\(tree\), V\)"),
    (lambda: verify_tree_sampling(ROWS3, TWINS, ROWS3[:2], UNUSED), r"Tree nodes 0 and 1 are siblings with the same"),
    (lambda: verify_tree_sampling(ROWS3, CHAIN, HALF, UNUSED), r"draft_probs\[1, 2\] is 0, .* tree node 1"),
]


@pytest.mark.parametrize("call, message", ERRORS)
def test_errors_name_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()
