"""Exact laws of short sampled continuations, and the chi-square fit against them."""

from __future__ import annotations

import torch


def engine_law(model, prompt: list[int], sampling) -> dict[tuple[int, int, int], float]:
    """P(t1, t2, t3 | prompt) for every continuation with nonzero probability, with the engine's
    numerics: the prompt prefilled in one fused pass (as Engine.start does), one exact step per
    token after it (what every verify pass equals). sampling: SamplingParams."""
    from specdec.sampling import process_logits

    tr = model.transformer

    def probs(prefix: list[int]) -> torch.Tensor:
        cache = tr.new_cache(len(prompt) + 4)
        slot = cache.allocate()
        out = tr.forward(torch.tensor([prompt]), cache, [slot], exact=False, last_only=True)
        for t in prefix:
            out = tr.forward(torch.tensor([[t]]), cache, [slot])
        return process_logits(out.logits[0, -1], sampling)

    law = {}
    p1 = probs([])
    for a in p1.nonzero().flatten().tolist():
        p2 = probs([a])
        for b in p2.nonzero().flatten().tolist():
            p3 = probs([a, b])
            for c in p3.nonzero().flatten().tolist():
                law[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return law


def fit_pvalue(counts: dict, law: dict) -> float:
    """Chi-square p-value of observed counts against the law (cells expected < 5 times pooled);
    0 when a continuation outside the law's support was sampled."""
    from scipy.stats import chisquare

    if not set(counts) <= set(law):
        return 0.0
    n = sum(counts.values())
    keys = sorted(law, key=lambda k: -law[k])
    big = [k for k in keys if law[k] * n >= 5]
    small = [k for k in keys if law[k] * n < 5]
    obs = [counts.get(k, 0) for k in big] + ([sum(counts.get(k, 0) for k in small)] if small else [])
    exp = [law[k] * n for k in big] + ([sum(law[k] for k in small) * n] if small else [])
    return float(chisquare(obs, [e * n / sum(exp) for e in exp]).pvalue)


def sample_continuations(engine, prompt: list[int], n: int, spec=None, **sampling) -> tuple[dict, int, int]:
    """Seeds 0..n-1 of 3-token continuations from engine.generate: (counts, drafted, accepted)."""
    from specdec.sampling import SamplingParams

    counts: dict = {}
    drafted = accepted = 0
    for seed in range(n):
        r = engine.generate(prompt, SamplingParams(**sampling, seed=seed), max_tokens=3, spec=spec)
        counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
        drafted += r.stats.drafted
        accepted += r.stats.accepted
    return counts, drafted, accepted
