"""Seeded chi-square tests of the whole generate loop with sampling, on the real smollm2.

The exact distribution of the first three tokens under the target (top-k 2, so 8
sequences) is enumerated with the model itself; plain sampling and speculative
sampling with one-hot n-gram drafts must both fit it.
"""

from __future__ import annotations

import pytest

from helpers.distribution import engine_law, fit_pvalue, sample_continuations
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "The cat sat on the mat. The cat sat on the"
PARAMS = dict(temperature=1.0, top_k=2)
SAMPLES = 300


@pytest.fixture(scope="module")
def engine(smollm):
    return Engine(smollm, max_len=256)


@pytest.fixture(scope="module")
def target_dist(engine):
    ids = engine.model.tokenizer.encode(PROMPT)
    dist = engine_law(engine.model, ids, SamplingParams(**PARAMS))
    assert abs(sum(dist.values()) - 1.0) < 1e-4 and len(dist) == 8
    return ids, dist


@pytest.fixture(scope="module")
def plain_counts(engine, target_dist):
    ids, _ = target_dist
    return sample_continuations(engine, ids, SAMPLES, SpecConfig(), **PARAMS)[0]


def test_plain_sampling_fits_the_target_distribution(target_dist, plain_counts):
    _, dist = target_dist
    assert fit_pvalue(plain_counts, dist) > 1e-3


# A draft model's sampled law is enumerated exactly in tests/lossless/test_law_matrix.py, with a draft that
# differs from the target (the target as its own draft, as here before, never samples the residual).
@pytest.mark.parametrize("spec", [SpecConfig(drafters=("ngram-simple",), draft_n_max=2)], ids=["ngram-one-hot"])
def test_speculative_sampling_fits_the_target_distribution(engine, target_dist, spec):
    ids, dist = target_dist
    counts, drafted, _ = sample_continuations(engine, ids, SAMPLES, spec, **PARAMS)
    assert drafted > 0, "the drafter never drafted: this test would prove nothing"
    p = fit_pvalue(counts, dist)
    assert p > 1e-3, f"{spec.method}: chi-square p = {p:.2e}; counts {counts}"


def test_the_fit_test_can_fail(engine, target_dist, plain_counts):
    """The same samples are rejected against the distribution of another temperature."""
    ids, _ = target_dist
    hot = engine_law(engine.model, ids, SamplingParams(temperature=3.0, top_k=2))
    assert fit_pvalue(plain_counts, hot) < 1e-3


def test_batched_sampling_fits_the_target_distribution(engine, target_dist):
    """The same law through Engine.step_batch: seeded requests ten at a time in one forward per
    step, beside a greedy request of another length whose answer must stay its solo answer."""
    ids, dist = target_dist
    batched = Engine(engine.model, max_len=256, max_sequences=11)
    spec = SpecConfig(drafters=("ngram-simple",), draft_n_max=2)
    neighbour = engine.model.tokenizer.encode("One, two, three, four,")
    alone = batched.generate(neighbour, SamplingParams(), 6).token_ids
    counts, drafted = {}, 0
    for first in range(0, SAMPLES, 10):
        reqs = [batched.admit(ids, SamplingParams(**PARAMS, seed=seed), 3, spec=spec)
                for seed in range(first, first + 10)]
        reqs.append(batched.admit(neighbour, SamplingParams(), 6))
        for _ in range(20):
            if all(r.finished for r in reqs):
                break
            batched.step_batch(reqs)
        for r in reqs:
            batched.finish(r)
        assert reqs[-1].output == alone
        for r in reqs[:-1]:
            counts[tuple(r.output)] = counts.get(tuple(r.output), 0) + 1
            drafted += r.stats.drafted
    assert drafted > 0, "the drafter never drafted: this test would prove nothing"
    p = fit_pvalue(counts, dist)
    assert p > 1e-3, f"batched: chi-square p = {p:.2e}; counts {counts}"


REPEATING = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.mark.parametrize("drafters", [("ngram-simple",), ("suffix",), ("ngram-simple", "suffix")])
def test_a_seed_draws_plain_decodings_text_under_one_hot_drafts(engine, drafters):
    """A deterministic draft is verified with plain decoding's draws (verify_tree_sampling), so a
    seed gives plain decoding's text whatever was drafted: alone, after the suffix trie has
    learned from earlier answers, and beside other sequences in one batch."""
    ids = engine.model.tokenizer.encode(REPEATING)
    spec = SpecConfig(drafters=drafters, draft_n_max=4)
    seeds = range(4)
    plain = [engine.generate(ids, SamplingParams(temperature=0.7, seed=s), 24).token_ids for s in seeds]
    drafted = 0
    for _ in range(2):  # the second pass drafts from a suffix trie fed by the first
        for s, want in zip(seeds, plain):
            r = engine.generate(ids, SamplingParams(temperature=0.7, seed=s), 24, spec=spec)
            assert r.token_ids == want, f"seed {s}"
            drafted += r.stats.drafted
    assert drafted > 0, "the drafters never drafted: this test would prove nothing"
    batched = Engine(engine.model, max_len=256, max_sequences=4)
    reqs = [batched.admit(ids, SamplingParams(temperature=0.7, seed=s), 24, spec=spec) for s in seeds]
    for _ in range(60):
        if all(r.finished for r in reqs):
            break
        batched.step_batch(reqs)
    for r, want in zip(reqs, plain):
        batched.finish(r)
        assert r.output == want
