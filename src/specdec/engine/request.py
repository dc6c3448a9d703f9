"""A running request's state (Request) and a finished one's answer (GenerationResult).

Engine.admit makes a Request; Engine.step_batch prefills it, then drafts, verifies and emits until it is
finished; Engine.finish gives its cache slot and drafters back; Engine.result reads its answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.drafters.base import Drafter
from specdec.engine.config import SpecConfig
from specdec.engine.constrain import Constraint
from specdec.engine.draft_length import DraftLengthPolicy
from specdec.engine.logprobs import TokenLogprob
from specdec.engine.stats import SpecStats
from specdec.engine.stop import StopStrings
from specdec.sampling import SamplingParams


@dataclass
class Request:
    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: StopStrings | None  # its stop strings, matched in the answer's text as it grows; None: none
    spec: SpecConfig
    slot: int  # its cache slot; -1 once Engine.finish gave it back
    drafters: list[Drafter]  # its own drafter set (tried in order each step)
    generator: torch.Generator
    draft_policy: DraftLengthPolicy  # its draft length each step, and its recent acceptance
    output: list[int] = field(default_factory=list)  # emitted tokens; the last one is not in the cache yet
    sources: list[int] = field(default_factory=list)  # sources[i]: where output[i] came from: 0 the target (a
    # plain step's token, a recovered or bonus token), i + 1 an accepted draft of drafters[i]
    prefilled: int = 0  # prompt tokens in the cache; the first token is emitted when all are
    stop_text: str | None = None  # the decoded output cut before the stop string that ended it
    finished: bool = False
    finish_reason: str | None = None  # "stop" (EOS or stop string) or "length"
    ended_on_eos: bool = False  # an EOS token ended it (not in output: the answer's text never holds it)
    skip_special: bool = True  # the answer's text leaves special tokens out (Engine.skip_special by default)
    stats: SpecStats = field(default_factory=SpecStats)
    hidden_layers: tuple[int, ...] = ()  # target layers some drafter reads (MTP, EAGLE-3); () = none
    cached_tokens: int = 0  # leading prompt tokens whose rows the prefix cache gave it (engine/prefix_cache.py)
    want_logprobs: int | None = None  # None: no logprobs; n: each emitted token's, and its row's n most likely
    logprobs: list[TokenLogprob] = field(default_factory=list)  # logprobs[i]: output[i]'s (engine/logprobs.py)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)  # the last verify's, a token it chose each
    constraint: Constraint | None = None  # its grammar's state (engine/constrain.py); None: unconstrained
    prefill_s: float = 0.0
    decode_s: float = 0.0


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    stats: SpecStats
    prefill_s: float
    decode_s: float
    ended_on_eos: bool = False  # an EOS token ended the answer; token_ids leave it out
    sources: list[int] = field(default_factory=list)  # sources[i]: where token_ids[i] came from, an index of
    source_names: tuple[str, ...] = ("target",)  # these: "target", then the request's drafters in order
    cached_tokens: int = 0  # leading prompt tokens the prefix cache gave (not prefilled)
    logprobs: list[TokenLogprob] | None = None  # logprobs[i]: token_ids[i]'s, when the request asked for them

    @property
    def completion_tokens(self) -> int:
        """Tokens the model generated, the EOS that ended the answer included, as vLLM's and llama-server's
        usage count them (token_ids leaves that EOS out, as the text does)."""
        return len(self.token_ids) + self.ended_on_eos

    @property
    def decode_tokens_per_s(self) -> float:
        # the first token comes from prefill; decode produced the rest (an EOS that ended it too)
        n = max(self.completion_tokens - 1, 0)
        return n / self.decode_s if self.decode_s > 0 else 0.0
