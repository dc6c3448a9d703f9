"""Real models for the tests: loaded on first use, kept while recently used.

The cache holds at most MAX_KEPT models. The real files go from 135M to 1.5B parameters and the
formats from int8 to fp32, so keeping every (model, format) a session ever asked for held ~5 GB
to the end; the least recently used one is dropped instead (a fixture that still holds it keeps
it alive until its scope ends). The suite runs in file order, so a model comes back to the cache
only where tests far apart ask for it.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from contextlib import contextmanager

MAX_KEPT = 3
_cache: OrderedDict = OrderedDict()


def real_model(name: str, fmt: str = "int8"):
    """A pulled model in a weight format, loaded on first use and kept while recently used."""
    from specdec.model.load import load_model

    key = (name, fmt)
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    while len(_cache) >= MAX_KEPT:
        _cache.popitem(last=False)
        gc.collect()
    _cache[key] = load_model(name, fmt, progress=False)
    return _cache[key]


def cached_models() -> list[tuple[str, str]]:
    """The (name, format) pairs held now, least recently used first."""
    return list(_cache)


@contextmanager
def fast_gguf_reader():
    """Within the block, gguf-py's GGUFReader (the reader transformers uses for `gguf_file=`) maps
    the file as a plain ndarray instead of an np.memmap: the same bytes and the same parsing, 5-6x
    faster on a 262k-token vocabulary, where every element access of a memmap subclass runs
    __array_finalize__ (gemma3-270m's header: 27 s -> 5 s, read twice per from_pretrained)."""
    import numpy as np
    from gguf import gguf_reader

    class NumpyWithPlainMaps:
        """numpy, as the reader module sees it, except that memmap returns a plain ndarray view."""

        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def memmap(*args, **kwargs):
            return np.memmap(*args, **kwargs).view(np.ndarray)

    gguf_reader.np = NumpyWithPlainMaps()
    try:
        yield
    finally:
        gguf_reader.np = np
