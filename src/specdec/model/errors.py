"""Errors meant for people: one sentence naming the thing and what to do."""


class SpecdecError(Exception):
    """Base class; the CLI prints these without a stack trace."""


class ModelFileError(SpecdecError):
    """A model file or folder cannot be used (truncated, corrupt, unsupported)."""

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class CacheOverflowError(SpecdecError):
    """A key or value too large for the float16 KV cache (it would be stored as inf)."""

    def __init__(self, count: int, layer: int | None = None):
        where = "" if layer is None else f" in layer {layer}"
        super().__init__(f"{count} key/value entries{where} exceed float16's range (65504) and would be stored as "
                         "inf in the float16 KV cache; run with --cache-type f32 (load_model(cache_type='f32'))")
        self.count = count
