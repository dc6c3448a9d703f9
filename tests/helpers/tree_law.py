"""The exact law of engine.generate with what a tree verifier did along the way.

generate_law (helpers/distribution.py) gives the law of the tokens and the expected accepted count;
this gives also the probability that a kept draft node was not its parent's first child: a later
sibling tried after a rejected one, the branch recursive rejection sampling exists for. Every random
draw is enumerated (helpers/branches.py); generate is replayed once per branch, each replay with drafters
that forget the answers of the replays before it (suffix and ngram-cache learn from earlier answers, and
a replay must draft what the first one did).
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.branches import Branches
from helpers.distribution import law_gap, prefill_once
from specdec.drafters.hidden import HiddenStateDrafter
from specdec.engine import engine as engine_module
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams


@dataclass(frozen=True)
class Law:
    tokens: dict[tuple[int, ...], float]  # P(emitted tokens)
    accepted: float  # E[accepted draft tokens]
    later_sibling: float  # P(some kept node was a later sibling)


class _Forgetful:
    """A drafter whose end() does nothing: it keeps no memory of one request's answer for the next."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def end(self, output) -> None:
        pass


def exact_law(monkeypatch, engine, prompt: list[int], spec=None, max_tokens: int = 3, **sampling) -> Law:
    """The law of engine.generate(prompt, ...) (an engine whose drafters are not built yet)."""
    branches = Branches(monkeypatch, multinomial=True)
    build = engine.drafter_factory
    monkeypatch.setattr(engine, "drafter_factory", lambda drafter_spec, spec: _Forgetful(build(drafter_spec, spec)))
    params = SamplingParams(**sampling, seed=0)  # the seed is never drawn from
    real_verify = engine_module.verify_tree_sampling
    seen = {"later": False}

    def verify(target_probs, tree, draft_probs, generator):
        result = real_verify(target_probs, tree, draft_probs, generator)
        for node in result.accepted_path:
            seen["later"] |= tree.children(tree.parents[node])[0] != node
        return result

    monkeypatch.setattr(engine_module, "verify_tree_sampling", verify)

    def run():
        seen["later"] = False
        r = engine.generate(prompt, params, max_tokens=max_tokens, spec=spec)
        return tuple(r.token_ids), r.stats.accepted, seen["later"]

    with prefill_once(engine.model.transformer):
        outcomes = branches.distribution(run)
    law: dict[tuple[int, ...], float] = {}
    for (tokens, _, _), p in outcomes.items():
        law[tokens] = law.get(tokens, 0.0) + p
    return Law(law, sum(p * a for (_, a, _), p in outcomes.items()),
               sum(p for (_, _, later), p in outcomes.items() if later))


def mtp_law(monkeypatch, model, head, prompt: list[int], **sampling) -> tuple[Law, float]:
    """The exact law of 4 sampled tokens drafted by an MTP `head` (draft-mtp, chains of 2, max_len 64), and its
    law_gap to plain sampling's law of the same tokens."""
    engine = Engine(model, max_len=64)
    engine.drafter_factory = lambda drafter_spec, s: HiddenStateDrafter(head, "draft-mtp", model.config.vocab_size,
                                                                        budget=2, max_len=64)
    law = exact_law(monkeypatch, engine, prompt, spec=SpecConfig(drafters=("draft-mtp",), draft_n_max=2),
                    max_tokens=4, **sampling)
    with monkeypatch.context() as patch:
        reference = exact_law(patch, Engine(model, max_len=64), prompt, max_tokens=4, **sampling).tokens
    return law, law_gap(law.tokens, reference)
