"""Real models, loaded once per test session (shared by fixtures and by tests that name a model)."""

from __future__ import annotations

_cache: dict = {}


def real_model(name: str, fmt: str = "int8"):
    """A pulled model in a weight format, loaded on first use and kept for the session."""
    from specdec.model.load import load_model

    key = (name, fmt)
    if key not in _cache:
        _cache[key] = load_model(name, fmt, progress=False)
    return _cache[key]
