"""Exact laws of short sampled continuations, and the chi-square check against them."""

from __future__ import annotations

from typing import Callable


def law_of_three(probs: Callable[[list[int]], "object"], prompt: list[int]) -> dict[tuple[int, int, int], float]:
    """P(t1, t2, t3 | prompt) for every continuation with nonzero probability.

    probs(seq) -> the processed next-token distribution (V,) after seq."""
    law = {}
    p1 = probs(prompt)
    for a in p1.nonzero().flatten().tolist():
        p2 = probs(prompt + [a])
        for b in p2.nonzero().flatten().tolist():
            p3 = probs(prompt + [a, b])
            for c in p3.nonzero().flatten().tolist():
                law[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return law


def assert_matches_law(law: dict, counts: dict, n: int, min_pvalue: float = 1e-3) -> None:
    """Chi-square of observed counts against the law; outcomes expected < 5 times are pooled."""
    from scipy.stats import chisquare

    keys = sorted(law, key=lambda k: -law[k])
    big = [k for k in keys if law[k] * n >= 5]
    small = [k for k in keys if law[k] * n < 5]
    obs = [counts.get(k, 0) for k in big] + ([sum(counts.get(k, 0) for k in small)] if small else [])
    exp = [law[k] * n for k in big] + ([sum(law[k] for k in small) * n] if small else [])
    assert sum(obs) == n, "an outcome outside the law's support was sampled"
    pvalue = chisquare(obs, [e * n / sum(exp) for e in exp]).pvalue
    assert pvalue > min_pvalue, f"sampled continuations do not follow the target's law (p = {pvalue:.2e})"
