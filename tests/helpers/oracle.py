"""A drafter that knows the answer and gets it wrong on purpose: every rollback length of a recurrent state taken
(the Qwen3.5 and Qwen3.5-MoE speculation tests)."""

from __future__ import annotations

from specdec.drafters.base import Draft, DrafterBase
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
