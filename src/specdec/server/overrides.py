"""Per-request speculative overrides -> a SpecConfig the server can run, or a 400.

    resolve_spec(SpecConfig(drafters=("ngram-simple",)), SpeculativeOverride(enabled=False))
        -> SpecConfig(drafters=())                            plain decoding
    resolve_spec(base, SpeculativeOverride(num_speculative_tokens=5))
        -> base.with_overrides(draft_n_max=5)                 same method, longer drafts
    resolve_spec(base, SpeculativeOverride(method="ngram", num_speculative_tokens=2))
        -> SpecConfig(drafters=("ngram-simple",), draft_n_max=2)

The override becomes a SpecRequest (engine/spec_request.py), checked there like every other
surface. What is the server's alone: it cannot honour a model drafter it has not loaded. A draft
model is usable only when it is the one the server was started with (-md), and an MTP / EAGLE-3 /
DFlash / DSpark drafter only when the server runs it already. Anything else is a 400, never a model
load in the middle of serving.
"""

from __future__ import annotations

from dataclasses import replace

from specdec.drafters import registry
from specdec.engine.config import SpecConfig
from specdec.engine.spec_request import SpecRequest, build_spec
from specdec.server.schemas import APIError, SpeculativeOverride


def resolve_spec(base: SpecConfig, override: SpeculativeOverride | None) -> SpecConfig:
    if override is None:
        return base
    given = override.model_dump(exclude_none=True)
    try:
        request = SpecRequest.from_override(**given)
        if request.drafters is None and given and not base.enabled:
            raise ValueError("this server runs without speculation; name a method, e.g. "
                             '"speculative": {"method": "ngram"}')
        request = _with_served_draft_model(base, request)
        spec, _notes = build_spec(request, base=base)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    for name in spec.types:  # model drafters: only those the server loaded at start
        entry = registry.entry(name)
        if entry.draft_model:
            _check_draft_model(base, spec.draft_model)
        elif entry.model:
            if name not in base.types:
                raise _bad(f"speculative method {name} needs a drafter this server has not loaded (it runs "
                           f"{base.method}); start the server with it instead")
            # the head the server loaded (-md), not whichever one the kind finds by default
            spec = spec.with_overrides(draft_model=base.draft_model)
    return spec


def _with_served_draft_model(base: SpecConfig, request: SpecRequest) -> SpecRequest:
    """A request for a draft-model method without "model" means the draft model the server loaded."""
    if request.draft_model is not None:
        _check_draft_model(base, request.draft_model)
        return request
    if any(registry.entry(d.kind).draft_model for d in request.drafters or ()):
        _check_draft_model(base, base.draft_model)
        return replace(request, draft_model=base.draft_model)
    return request


def _check_draft_model(base: SpecConfig, name: str | None) -> None:
    serves_one = any(registry.entry(k).draft_model for k in base.types)
    if not serves_one or name != base.draft_model:
        if name is None:
            raise _bad("a draft-model method needs a draft model and this server loaded none; "
                       "start the server with --model-draft")
        loaded = f"it loaded {base.draft_model!r}" if serves_one else "it loaded no draft model"
        raise _bad(f"draft model {name!r} is not loaded on this server ({loaded}); "
                   "start the server with --model-draft to use it")


def _bad(message: str) -> APIError:
    return APIError(400, message, param="speculative", code="invalid_speculative_config")
