"""Open an Engine from settings: threads set, the target loaded, speculation decided (auto included), its
drafters built and checked. The command line (cli/options.build_engine) and the library (specdec.LLM) both
open theirs here, so the same settings run the same engine whichever way they were given.

    request = SpecRequest.from_flags(spec_type="suffix")
    engine, notes = open_engine("smollm2-135m", request, ctx_size=2048, threads=2)

Errors name the command line's flags (--ctx-size, --threads); LLM's keyword arguments are those flags.
"""

from __future__ import annotations

import sys

from specdec.drafters import registry
from specdec.engine.engine import Engine
from specdec.engine.spec_request import AutoTarget, SpecRequest, build_spec
from specdec.model.device import pick_device
from specdec.model.load import load_model
from specdec.model.threads import set_threads
from specdec.sampling import is_whole

DEFAULT_CTX_SIZE = 4096  # tokens per sequence unless --ctx-size says (the model's context length where shorter)


def open_engine(model: str, request: SpecRequest, *, weights: str | None = None, ctx_size: int | None = None,
                cache_type: str | None = None, device: str | None = None, threads: int | None = None,
                max_sequences: int = 1, progress: bool = True) -> tuple[Engine, list[str]]:
    """(engine, notes for people: auto's reasons, a context capped to the model's). An explicit request is
    checked before the model loads (a bad setting costs no minute of loading)."""
    check_explicit(request)
    check_ctx_size(ctx_size)
    set_threads(threads)  # before the load: repacking a GGUF file's blocks runs on the threads too
    target = load_model(model, weights, progress=progress, device=pick_device(device), cache_type=cache_type)
    spec, notes = build_spec(request, AutoTarget.of_model(target))
    engine = Engine(target, spec, max_len=context_size(ctx_size), max_sequences=max_sequences)
    notes += [note] if (note := capped_context_note(ctx_size, engine)) else []
    engine.drafters_for(spec)  # load and check drafters now, not in the middle of a request
    return engine, notes


def check_explicit(request: SpecRequest):
    """The SpecConfig of a request that names its drafters, checked before any model loads (a model-free
    drafter's options too); None for auto, which reads the model's files to choose."""
    if request.wants_auto:
        return None
    spec, notes = build_spec(request)
    for drafter in spec.drafters:
        registry.check_options(drafter)
    return spec, notes


def context_size(ctx_size: int | None) -> int:
    """The context per sequence that --ctx-size asks for (None: not given, DEFAULT_CTX_SIZE; 0: the model's)."""
    return DEFAULT_CTX_SIZE if ctx_size is None else ctx_size


def capped_context_note(ctx_size: int | None, engine: Engine) -> str | None:
    """What to say when a --ctx-size given was more than the model addresses (the engine holds the model's)."""
    if ctx_size is None or ctx_size <= engine.cache.max_len:
        return None
    return (f"--ctx-size {ctx_size} is more than {engine.model.info.name} can address; its context is "
            f"{engine.cache.max_len} tokens")


def check_ctx_size(ctx_size: int | None) -> None:
    if ctx_size is not None and (not is_whole(ctx_size) or ctx_size < 0):
        raise ValueError(f"--ctx-size must be 0 (the model's context length) or more, got {ctx_size}")


def note_capped_context(ctx_size: int | None, engine) -> None:
    """Say so when a --ctx-size given was more than the model addresses (the engine holds the model's)."""
    note = capped_context_note(ctx_size, engine)
    if note:
        print(f"note: {note}", file=sys.stderr)
