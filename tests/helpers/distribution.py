"""Exact laws of short sampled continuations, and two ways to hold the engine to them: a
chi-square fit of seeded samples, and the exact law of the engine's own loop (every random
draw enumerated)."""

from __future__ import annotations

from contextlib import contextmanager

import torch


def engine_law(model, prompt: list[int], sampling, depth: int = 3) -> dict[tuple[int, ...], float]:
    """P(t1, ..., t_depth | prompt) for every continuation with nonzero probability, with the
    engine's numerics: the prompt prefilled in one fused pass (as Engine.start does), one exact
    step per token after it (what every verify pass equals). sampling: SamplingParams.

    The prompt is prefilled once; each continuation is walked depth-first, rolling the cache
    back to its parent before stepping (an exact step reads only the entries before it).
    """
    from specdec.sampling import process_logits

    tr = model.transformer
    cache = tr.new_cache(len(prompt) + depth + 1)
    slot = cache.allocate()
    out = tr.forward(torch.tensor([prompt]), cache, [slot], exact=False, last_only=True)
    law: dict[tuple[int, ...], float] = {}

    def walk(logits: torch.Tensor, prefix: tuple[int, ...], p: float) -> None:
        probs = process_logits(logits, sampling)  # (V,)
        for t in probs.nonzero().flatten().tolist():
            if len(prefix) + 1 == depth:
                law[prefix + (t,)] = p * float(probs[t])
                continue
            cache.truncate(slot, len(prompt) + len(prefix))
            step = tr.forward(torch.tensor([[t]]), cache, [slot])
            walk(step.logits[0, -1], prefix + (t,), p * float(probs[t]))

    walk(out.logits[0, -1], (), 1.0)
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


@contextmanager
def prefill_once(transformer):
    """Within the block, a forward into empty cache slots that repeats an earlier one (same
    tokens, same options) writes the K/V the first one wrote and returns its output, instead of
    computing them again. Such a forward reads nothing but its arguments, so the replay is the
    value the forward would return; every other forward (each verify step) runs for real.
    Sampling the same prompt many times then pays for its prefill once."""
    real = transformer.forward_batch
    seen: dict = {}

    @torch.inference_mode()
    def forward_batch(segments, cache, hidden_layers=()):
        if len(segments) != 1:
            return real(segments, cache, hidden_layers)
        (seg,) = segments
        if cache.lengths[seg.slot] != 0 or seg.positions is not None or seg.tree_mask is not None:
            return real(segments, cache, hidden_layers)
        key = (tuple(seg.tokens.tolist()), seg.exact, seg.last_only, tuple(hidden_layers), cache.k.dtype,
               cache.max_len)
        T, s = len(seg.tokens), seg.slot
        if key not in seen:
            (out,) = real(segments, cache, hidden_layers)
            seen[key] = (out, cache.k[:, s, :, :T].clone(), cache.v[:, s, :, :T].clone())
        out, k, v = seen[key]
        cache.k[:, s, :, :T] = k
        cache.v[:, s, :, :T] = v
        cache.lengths[s] = T
        return [type(out)(out.logits.clone(), {layer: h.clone() for layer, h in out.hidden.items()})]

    transformer.forward_batch = forward_batch
    try:
        yield
    finally:
        del transformer.forward_batch  # the class's method again


def sample_continuations(engine, prompt: list[int], n: int, spec=None, **sampling) -> tuple[dict, int, int]:
    """Seeds 0..n-1 of 3-token continuations from engine.generate: (counts, drafted, accepted).
    The prompt's prefill is computed once and replayed (prefill_once)."""
    from specdec.sampling import SamplingParams

    counts: dict = {}
    drafted = accepted = 0
    with prefill_once(engine.model.transformer):
        for seed in range(n):
            r = engine.generate(prompt, SamplingParams(**sampling, seed=seed), max_tokens=3, spec=spec)
            counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
            drafted += r.stats.drafted
            accepted += r.stats.accepted
    return counts, drafted, accepted


def generate_law(monkeypatch, engine, prompt: list[int], spec=None, max_tokens: int = 3,
                 **sampling) -> tuple[dict[tuple[int, ...], float], float]:
    """The exact law of engine.generate's tokens and the expected number of accepted draft tokens:
    every random draw (the first token, the drafter's tree or chain, each accept and recovery) is
    a branch point (helpers/branches.py) and generate is replayed once per branch."""
    from helpers.branches import Branches
    from specdec.sampling import SamplingParams

    branches = Branches(monkeypatch, multinomial=True)
    params = SamplingParams(**sampling, seed=0)  # the seed is never drawn from

    def run():
        r = engine.generate(prompt, params, max_tokens=max_tokens, spec=spec)
        return tuple(r.token_ids), r.stats.accepted

    with prefill_once(engine.model.transformer):
        outcomes = branches.distribution(run)
    law: dict[tuple[int, ...], float] = {}
    for (tokens, _), p in outcomes.items():
        law[tokens] = law.get(tokens, 0.0) + p
    return law, sum(p * accepted for (_, accepted), p in outcomes.items())


def law_gap(a: dict, b: dict) -> float:
    """Largest difference in probability of one outcome between two laws."""
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in a.keys() | b.keys())
