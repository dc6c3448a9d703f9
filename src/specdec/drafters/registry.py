"""Drafters by name (STYLE.md convention 4): names are resolved here, once.

    >>> from specdec.drafters import registry
    >>> registry.create("ngram-simple", n_max=4).name
    'ngram-simple'

A factory is any callable that takes keyword arguments and returns a Drafter; register
more with the decorator:

    @registry.register("draft-simple")
    def make_draft_model(model_path: str, n_max: int = 3) -> Drafter: ...

Names follow llama.cpp's --spec-type values.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from specdec.drafters.base import Drafter
from specdec.drafters.ngram import NgramCache, NgramMapK, NgramMapK4V, NgramSimple
from specdec.drafters.suffix import SuffixDrafter

Factory = Callable[..., Drafter]
_factories: dict[str, Factory] = {}


def register(name: str) -> Callable[[Factory], Factory]:
    """Decorator: make `factory` available as `name`. A name names one factory only."""

    def add(factory: Factory) -> Factory:
        known = _factories.get(name)
        if known is not None and known is not factory:
            raise ValueError(
                f"drafter name {name!r} is already registered to {known!r}; pick another name"
            )
        _factories[name] = factory
        return factory

    return add


def names() -> list[str]:
    """The registered drafter names, sorted."""
    return sorted(_factories)


def create(name: str, **kwargs: Any) -> Drafter:
    """A new drafter of kind `name`, built with keyword arguments `kwargs`."""
    factory = _factories.get(name)
    if factory is None:
        raise ValueError(f"unknown drafter {name!r}; valid names are: {', '.join(names())}")
    accepted = _keyword_args(factory)
    if accepted is not None:
        unknown = sorted(set(kwargs) - accepted)
        if unknown:
            valid = ", ".join(sorted(accepted)) or "none"
            given = ", ".join(map(repr, unknown))
            raise ValueError(f"drafter {name!r} takes no argument {given}; it takes: {valid}")
    return factory(**kwargs)


def _keyword_args(factory: Factory) -> set[str] | None:
    """Names `factory` accepts as keywords, or None when it takes **kwargs or can't be inspected."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


for _name, _cls in (
    ("ngram-simple", NgramSimple),
    ("ngram-map-k", NgramMapK),
    ("ngram-map-k4v", NgramMapK4V),
    ("ngram-cache", NgramCache),
    ("suffix", SuffixDrafter),
):
    register(_name)(_cls)
