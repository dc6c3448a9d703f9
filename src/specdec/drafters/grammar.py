"""The grammar as a drafter: where a request's grammar allows one continuation only (a JSON key, the
punctuation around it, a tool's name and argument skeleton), that continuation is the draft, for free.

It keeps its own state of the request's grammar (SamplingParams.grammar), advanced over the tokens the
context gained since its last proposal, and proposes the tokens llguidance says the grammar forces next,
tokenized as the tokenizer would write them. The target verifies them under the same mask as any draft;
it rejects one only where it prefers another tokenization of the same bytes. A request without a
grammar gets no draft. Its registry entry is `first`: tried before every other kind, which draft where
the grammar leaves a choice (their drafts cut where it forbids a token, engine/constrain.py).

    drafter.begin(prompt, SamplingParams(grammar=grammar))
    drafter.propose(prompt + output, 8).tokens    # e.g. the ids of '", "unit": "' after a value
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.drafters.base import Draft, DrafterBase
from specdec.sampling import SamplingParams
from specdec.sampling.grammar import GrammarState


class GrammarDrafter(DrafterBase):
    name = "grammar"

    def __init__(self):
        self.state: GrammarState | None = None
        self.seen = 0  # context tokens the state has consumed (the prompt counts as consumed)

    def begin(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(),
              generator: torch.Generator | None = None) -> None:
        self.state = GrammarState(sampling.grammar) if sampling.grammar is not None else None
        self.seen = len(prompt)

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        if self.state is None or draft_length <= 0:
            return Draft()
        self.state.advance(context[self.seen:])
        self.seen = len(context)
        return Draft.chain(self.state.forced(draft_length))

    def end(self, output: Sequence[int]) -> None:
        self.state = None
