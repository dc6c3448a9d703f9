"""Per-request speculative overrides -> a SpecConfig the server can run, or a 400.

    resolve_spec(SpecConfig(drafters=("ngram-simple",)), SpeculativeOverride(enabled=False))
        -> SpecConfig(drafters=())                            plain decoding
    resolve_spec(base, SpeculativeOverride(num_speculative_tokens=5))
        -> base.with_overrides(draft_n_max=5)                 same method, longer drafts
    resolve_spec(base, SpeculativeOverride(method="ngram", num_speculative_tokens=2))
        -> spec_config_from_flags(speculative_config='{"method": "ngram", ...}')

The server cannot honour a model drafter it has not loaded: a draft model is usable
only when it is the one the server was started with (-md), and an EAGLE-3/MTP/DFlash/
DSpark drafter only when the server runs it already. Anything else is a 400, never a
model load in the middle of serving.
"""

from __future__ import annotations

import json

from specdec.drafters import registry
from specdec.engine.config import SpecConfig, SpecFlags, parse_spec_types, spec_config_from_flags
from specdec.server.schemas import APIError, SpeculativeOverride


def resolve_spec(base: SpecConfig, override: SpeculativeOverride | None) -> SpecConfig:
    if override is None:
        return base
    given = override.model_dump(exclude_none=True)
    if override.enabled is False:
        if set(given) - {"enabled"}:
            raise _bad(f"speculative.enabled is false but other settings are given "
                       f"({', '.join(sorted(set(given) - {'enabled'}))}); send one or the other")
        return base.with_overrides(drafters=())
    try:
        if override.method is not None or override.spec_type is not None:
            spec = _from_method(base, override)
        else:
            if not base.enabled and given:
                raise _bad("this server runs without speculation; name a method, e.g. "
                           '"speculative": {"method": "ngram"}')
            if override.model is not None:
                _check_draft_model(base, override.model)
            changes = {"draft_n_max": override.num_speculative_tokens, "draft_n_min": override.draft_n_min,
                       "draft_p_min": override.draft_p_min, "adaptive": override.adaptive}
            spec = base.with_overrides(**{k: v for k, v in changes.items() if v is not None})
    except ValueError as exc:
        raise _bad(str(exc)) from None
    for name in spec.types:  # model drafters: only those the server loaded at start
        if name == "draft-simple":
            _check_draft_model(base, spec.draft_model)
        elif registry.entry(name).model:
            if name not in base.types:
                raise _bad(f"speculative method {name} needs a drafter this server has not loaded (it runs "
                           f"{base.method}); start the server with it instead")
            # the head the server loaded (-md), not whichever one the kind finds by default
            spec = spec.with_overrides(draft_model=base.draft_model)
    if override.draft_p_min and spec.model_kind is None:
        raise _bad(f"draft_p_min is where a model drafter stops drafting for want of confidence; {spec.method} "
                   "drafts without one, so it would do nothing")
    return spec


def _from_method(base: SpecConfig, o: SpeculativeOverride) -> SpecConfig:
    if o.spec_type is not None and o.spec_type.strip() == "auto":
        raise ValueError("spec_type auto is decided when the server starts (it runs "
                         f"{base.method}); leave spec_type out to get that")
    types = parse_spec_types(o.spec_type) if o.spec_type is not None else ()
    wants_model = o.method == "draft_model" or "draft-simple" in types
    # a draft-model request without "model" means the draft model the server loaded
    model = o.model if o.model is not None else (base.draft_model if wants_model else None)
    if wants_model or model is not None:
        _check_draft_model(base, model)
    if o.method is not None:
        cfg = {"method": o.method}
        if o.num_speculative_tokens is not None:
            cfg["num_speculative_tokens"] = o.num_speculative_tokens
        n_max = None
    else:
        cfg, n_max = None, o.num_speculative_tokens
    spec, _notes = spec_config_from_flags(SpecFlags(
        spec_type=o.spec_type, model_draft=model, draft_n_max=n_max, draft_n_min=o.draft_n_min,
        draft_p_min=o.draft_p_min, speculative_config=json.dumps(cfg) if cfg else None,
        adaptive=bool(o.adaptive), cross_tokenizer=base.cross_tokenizer, typical=base.acceptance == "typical",
    ))
    return spec


def _check_draft_model(base: SpecConfig, name: str | None) -> None:
    if "draft-simple" not in base.types or name != base.draft_model:
        if name is None:
            raise _bad("a draft-model method needs a draft model and this server loaded none; "
                       "start the server with --model-draft")
        loaded = f"it loaded {base.draft_model!r}" if "draft-simple" in base.types else "it loaded no draft model"
        raise _bad(f"draft model {name!r} is not loaded on this server ({loaded}); "
                   "start the server with --model-draft to use it")


def _bad(message: str) -> APIError:
    return APIError(400, message, param="speculative", code="invalid_speculative_config")
