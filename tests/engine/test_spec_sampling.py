"""Seeded chi-square tests of the whole generate loop with sampling, on the real smollm2.

The exact distribution of the first three tokens under the target (top-k 2, so 8
sequences) is enumerated with the model itself; plain sampling and speculative
sampling (one-hot n-gram drafts, and a draft model with its own probabilities) must
both fit it.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams, process_logits

pytestmark = pytest.mark.slow

PROMPT = "The cat sat on the mat. The cat sat on the"
PARAMS = dict(temperature=1.0, top_k=2)
SAMPLES = 300


@pytest.fixture(scope="module")
def engine(smollm):
    return Engine(smollm, max_len=256)


def exact_distribution(model, prompt_ids, **params) -> dict[tuple[int, ...], float]:
    tr = model.transformer
    params = SamplingParams(**(params or PARAMS))

    def probs(prefix):
        cache = tr.new_cache(128)
        # the same numerics as the engine: fused prefill of the prompt, exact steps after it
        out = tr.forward(torch.tensor([prompt_ids]), cache, [0], exact=False, last_only=True)
        for t in prefix:
            out = tr.forward(torch.tensor([[t]]), cache, [0])
        return process_logits(out.logits[0, -1], params)

    dist = {}
    p1 = probs([])
    for a in p1.nonzero().flatten().tolist():
        p2 = probs([a])
        for b in p2.nonzero().flatten().tolist():
            p3 = probs([a, b])
            for c in p3.nonzero().flatten().tolist():
                dist[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return dist


def sample_counts(engine, ids, spec, n):
    counts: dict[tuple[int, ...], int] = {}
    stats_drafted = 0
    for seed in range(n):
        out = engine.generate(ids, SamplingParams(seed=seed, **PARAMS), max_tokens=3, spec=spec)
        key = tuple(out.token_ids)
        counts[key] = counts.get(key, 0) + 1
        stats_drafted += out.stats.drafted
    return counts, stats_drafted


def fit_pvalue(counts, dist, n):
    keys = sorted(dist, key=dist.get, reverse=True)
    if not set(counts) <= set(dist):
        return 0.0  # a sequence the target cannot produce
    observed = [counts.get(k, 0) for k in keys]
    expected = [dist[k] * n for k in keys]
    # merge cells expected below 5 into one
    big = [i for i, e in enumerate(expected) if e >= 5]
    small = [i for i in range(len(keys)) if i not in big]
    obs = [observed[i] for i in big] + ([sum(observed[i] for i in small)] if small else [])
    exp = [expected[i] for i in big] + ([sum(expected[i] for i in small)] if small else [])
    scale = sum(obs) / sum(exp)
    return chisquare(obs, [e * scale for e in exp]).pvalue


@pytest.fixture(scope="module")
def target_dist(engine):
    ids = engine.model.tokenizer.encode(PROMPT)
    dist = exact_distribution(engine.model, ids)
    assert abs(sum(dist.values()) - 1.0) < 1e-4 and len(dist) == 8
    return ids, dist


@pytest.fixture(scope="module")
def plain_counts(engine, target_dist):
    ids, _ = target_dist
    return sample_counts(engine, ids, SpecConfig(), SAMPLES)[0]


def test_plain_sampling_fits_the_target_distribution(target_dist, plain_counts):
    _, dist = target_dist
    assert fit_pvalue(plain_counts, dist, SAMPLES) > 1e-3


@pytest.mark.parametrize("spec", [
    SpecConfig(types=("ngram-simple",), draft_n_max=2),
    SpecConfig(types=("draft-simple",), draft_model="smollm2-135m", draft_n_max=2),
], ids=["ngram-one-hot", "draft-model-probs"])
def test_speculative_sampling_fits_the_target_distribution(engine, target_dist, spec):
    ids, dist = target_dist
    counts, drafted = sample_counts(engine, ids, spec, SAMPLES)
    assert drafted > 0, "the drafter never drafted: this test would prove nothing"
    p = fit_pvalue(counts, dist, SAMPLES)
    assert p > 1e-3, f"{spec.method}: chi-square p = {p:.2e}; counts {counts}"


def test_the_fit_test_can_fail(engine, target_dist, plain_counts):
    """The same samples are rejected against the distribution of another temperature."""
    ids, _ = target_dist
    hot = exact_distribution(engine.model, ids, temperature=3.0, top_k=2)
    assert fit_pvalue(plain_counts, hot, SAMPLES) < 1e-3
