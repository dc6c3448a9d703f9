"""A drafter that knows the answer and gets it wrong on purpose: every rollback length of a recurrent state taken
(the Qwen3.5 and Qwen3.5-MoE speculation tests)."""

from __future__ import annotations

from specdec.drafters.base import Draft, DrafterBase
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams


class Oracle(DrafterBase):
    """Drafts the plain answer with one token changed at a depth that cycles through 0..k (k: none), so steps
    are accepted whole, in part and not at all: every rollback length of the recurrent state is taken."""

    name = "oracle"

    def __init__(self, prompt: list[int], answer: list[int], vocab: int):
        self.prompt, self.answer, self.vocab, self.steps = prompt, answer, vocab, 0
        self.accepted = self.rejected = 0

    def propose(self, context, draft_length: int) -> Draft:
        done = len(context) - len(self.prompt)
        tokens = list(self.answer[done : done + draft_length])
        wrong = self.steps % (draft_length + 1)
        self.steps += 1
        if wrong < len(tokens):
            tokens[wrong] = (tokens[wrong] + 1) % self.vocab
        self.drafted = len(tokens)
        return Draft.chain(tokens)

    def on_accept(self, num_accepted: int) -> None:
        self.accepted += num_accepted
        self.rejected += self.drafted - num_accepted


def plain(model, prompt, n):
    """Plain greedy decoding's n tokens after `prompt`."""
    return Engine(model, max_len=128).generate(prompt, SamplingParams(), max_tokens=n).token_ids


def oracle_engine(target, drafter_factory, max_sequences: int = 1) -> Engine:
    """An engine drafting with what drafter_factory() gives (chains of up to 4, no shorter than 1)."""
    return Engine(target, SpecConfig(drafters=("suffix",), draft_n_max=4, draft_n_min=1), max_len=128,
                  drafter_factory=lambda drafter_spec, spec: drafter_factory(), max_sequences=max_sequences)


def assert_oracle_keeps_plain(target, prompt: list[int], n: int) -> list[int]:
    """Greedy speculation with an Oracle's drafts (accepted whole, in part and not at all) gives plain decoding's
    n tokens; returns them."""
    answer = plain(target, prompt, n)
    oracle = Oracle(prompt, answer, target.config.vocab_size)
    assert oracle_engine(target, lambda: oracle).generate(prompt, SamplingParams(), max_tokens=n).token_ids == answer
    assert oracle.accepted > 0 and oracle.rejected > 0
    return answer


def assert_batched_oracles_keep_plain(target, prompts: list[list[int]], n: list[int]) -> None:
    """Three requests in one forward a step, the third joining late (prefilling beside the others' verify), each
    with its Oracle: every answer is its plain one, and drafts were accepted and rejected."""
    answers = [plain(target, p, k) for p, k in zip(prompts, n)]
    oracles = iter([Oracle(p, a, target.config.vocab_size) for p, a in zip(prompts, answers)])
    engine = oracle_engine(target, lambda: next(oracles), max_sequences=3)
    reqs = [engine.admit(prompts[0], SamplingParams(), n[0]), engine.admit(prompts[1], SamplingParams(), n[1])]
    for step in range(100):
        if step == 2:
            reqs.append(engine.admit(prompts[2], SamplingParams(), n[2]))
        if len(reqs) == 3 and all(r.finished for r in reqs):
            break
        engine.step_batch([r for r in reqs if not r.finished])
    for req, answer in zip(reqs, answers):
        engine.finish(req)
        assert req.output == answer
    assert sum(r.stats.accepted for r in reqs) > 0 and sum(r.stats.drafted - r.stats.accepted for r in reqs) > 0
