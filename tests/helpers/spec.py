"""Speculative settings as the command line gives them (engine/spec_request), for tests."""

from __future__ import annotations

from specdec.engine.spec_request import AutoTarget, SpecRequest, build_spec


def spec_of(*args, **flags):
    """(SpecConfig, notes) of these flags (SpecRequest.from_flags' names: spec_type, model_draft, ...)."""
    return build_spec(SpecRequest.from_flags(*args, **flags))


def spec_for_model(model, *args, **flags):
    """(SpecConfig, notes) of these flags for a loaded model: auto decides where the flags leave it to."""
    return build_spec(SpecRequest.from_flags(*args, **flags), AutoTarget.of_model(model))
