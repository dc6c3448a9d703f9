"""The checks of what callers hand the engine, each failing with one sentence that names the argument.

They run before anything is allocated: a request that fails here holds no cache slot and no drafters.
"""

from __future__ import annotations

from typing import Sequence

from specdec.engine.config import SpecConfig
from specdec.sampling import SamplingParams, is_whole


def check_engine_args(max_len: int, max_sequences: int, spec: SpecConfig) -> None:
    """Engine(...)'s sizes and settings."""
    for name, value, least in (("max_len", max_len, 0), ("max_sequences", max_sequences, 1)):
        if not is_whole(value) or value < least:  # True, 2.0 and -1 too: torch's errors would name neither
            raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")
    if not isinstance(spec, SpecConfig):
        raise TypeError(f"spec must be a SpecConfig, got {type(spec).__name__}")


def check_request(prompt: Sequence[int], sampling: SamplingParams, max_tokens: int, stop: Sequence[str] | str,
                  spec: SpecConfig, max_len: int, vocab_size: int) -> tuple[list[int], tuple[str, ...]]:
    """Engine.admit's arguments, for a context of max_len tokens and a vocabulary of vocab_size ids.
    Returns the prompt as a list of ints and the stop strings as a tuple ("xy" is one stop string).

    >>> check_request((1, 2), SamplingParams(), 8, "\\n", SpecConfig(), 64, 100)
    ([1, 2], ('\\n',))
    """
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    if not isinstance(spec, SpecConfig):
        raise TypeError(f"spec must be a SpecConfig, got {type(spec).__name__}")
    if isinstance(prompt, (str, bytes, dict)):
        raise TypeError(f"prompt must be a sequence of token ids, got {type(prompt).__name__} (encode text with "
                        "model.tokenizer.encode)")
    prompt = list(prompt)
    ids = [int(t) for t in prompt]
    odd = [t for t, i in zip(prompt, ids) if t != i or isinstance(t, bool)]
    if odd:
        raise ValueError(f"prompt token ids must be integers, got {odd[0]!r}")  # 5.7 is not token 5
    prompt = ids
    if not prompt:
        raise ValueError("the prompt is empty")
    if not is_whole(max_tokens) or max_tokens < 1:  # not nan, inf or 2.5
        raise ValueError(f"max_tokens must be a whole number of at least 1, got {max_tokens!r}")
    stop = (stop,) if isinstance(stop, str) else tuple(stop or ())  # "xy" is one stop string, not "x", "y"
    if any(not isinstance(s, str) or not s for s in stop):
        raise ValueError(f"stop strings must be non-empty strings, got {list(stop)!r}")
    if len(prompt) + 1 > max_len:
        raise ValueError(f"the prompt has {len(prompt)} tokens; the context holds {max_len}")
    if sampling.grammar is not None and sampling.grammar.vocabulary.size != vocab_size:
        raise ValueError(f"the grammar was compiled for a vocabulary of {sampling.grammar.vocabulary.size} tokens; "
                         f"this model has {vocab_size} (compile it with engine.constrain.compile_for(model, ...))")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    return prompt, stop


def check_step_args(reqs: Sequence, prefill_chunk: int | None) -> None:
    """Engine.step_batch's: a prefill chunk of at least one token, and no request already finished with
    Engine.finish (its slot is -1, which would index the last slot: another request's)."""
    if prefill_chunk is not None and (not is_whole(prefill_chunk) or prefill_chunk < 1):
        raise ValueError(f"prefill_chunk must be a whole number of at least 1 (None: the whole prompt), got "
                         f"{prefill_chunk!r}")
    if any(req.slot < 0 and not req.finished for req in reqs):
        raise ValueError("a request given to step was already given back with Engine.finish; admit it again")
