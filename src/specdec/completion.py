"""What the library (specdec.LLM) answers: a Completion per prompt, frozen, with its text, token ids, why it
ended, its counts, its timing and its speculative counters.

    out = llm.generate("def fib(n):", max_tokens=32)
    out.text, out.token_ids, out.finish_reason          # "stop": the model or a stop string ended it;
    out.cut_by                                          # "length": "max_tokens" or "context" cut it
    out.timing.decode_tokens_per_s, out.spec.acceptance_rate, out.spec.summary()

The fields are `specdec generate --json`'s (text, token_ids, finish_reason, prompt_tokens,
completion_tokens, timing, spec), so the same request gives the same values either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.engine.request import GenerationResult
from specdec.engine.stats import SpecStats


@dataclass(frozen=True)
class Timing:
    prefill_s: float  # the prompt's forward, which emits the first token
    decode_s: float  # every step after it
    decode_tokens_per_s: float  # tokens after the first, per second of decode_s

    def to_dict(self) -> dict:
        return {"prefill_s": self.prefill_s, "decode_s": self.decode_s,
                "decode_tokens_per_s": self.decode_tokens_per_s}


@dataclass(frozen=True)
class Completion:
    """One answer. token_ids leave out the EOS that ended it (as text does); completion_tokens counts it, as
    vLLM's and llama-server's usage do. spec: the speculative counters (SpecStats: acceptance_rate,
    mean_acceptance_length, summary(), to_dict())."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" (the model's end of turn, or a stop string) or "length" (a limit: see cut_by)
    cut_by: str | None  # "max_tokens" or "context" when finish_reason is "length", else None
    prompt_tokens: int
    completion_tokens: int
    timing: Timing
    spec: SpecStats

    @staticmethod
    def of(result: GenerationResult, max_tokens: int) -> Completion:
        """The Completion of an engine's result; max_tokens: the limit the engine ran it with."""
        timing = Timing(result.prefill_s, result.decode_s, result.decode_tokens_per_s)
        return Completion(result.text, tuple(result.token_ids), result.finish_reason, cut_by(result, max_tokens),
                          result.prompt_tokens, result.completion_tokens, timing, result.stats)

    def to_dict(self) -> dict:
        """`specdec generate --json`'s object, less the model."""
        return {"text": self.text, "token_ids": list(self.token_ids), "finish_reason": self.finish_reason,
                "cut_by": self.cut_by, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "timing": self.timing.to_dict(),
                "spec": self.spec.to_dict()}


def cut_by(result: GenerationResult, max_tokens: int) -> str | None:
    """Which limit ended an answer: "max_tokens" (it holds max_tokens tokens), "context" (prompt and answer
    filled the context first), or None (the model ended it, a stop string, an interruption).

    >>> cut_by(GenerationResult([5, 6], "ab", "length", 3, SpecStats(), 0.0, 0.0), max_tokens=2)
    'max_tokens'
    """
    if result.finish_reason != "length":
        return None
    return "max_tokens" if len(result.token_ids) >= max_tokens else "context"
