"""Errors meant for people: one sentence naming the thing and what to do."""


class SpecdecError(Exception):
    """Base class; the CLI prints these without a stack trace."""


class ModelFileError(SpecdecError):
    """A model file or folder cannot be used (truncated, corrupt, unsupported)."""

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def unread_bias(path, names: list[str]) -> ModelFileError:
    """The error for bias tensors specdec's layers do not add (o_proj's, an MLP's): run without them, the model
    would compute another output than its file's."""
    more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
    return ModelFileError(path, f"tensor {names[0]}{more}: specdec's layers have no such bias (only attention q/k/v "
                          "biases); running without it would change the model's output")


def unread_tensors(path, arch: str, names: list[str]) -> ModelFileError:
    """The error for GGUF tensors no name of specdec's `arch` model maps (a part of a model specdec does not
    compute, e.g. attention sinks): loaded without them, the model would compute another output than its file's."""
    more = f" (and {len(names) - 1} more: {', '.join(names[1:4])}{', ...' if len(names) > 4 else ''})" if len(names) > 1 else ""
    return ModelFileError(path, f"tensor {names[0]}{more} is not one specdec's {arch} model reads; running "
                          "without it would change the model's output")


class CacheOverflowError(SpecdecError):
    """A key or value too large for the float16 KV cache (it would be stored as inf)."""

    def __init__(self, count: int, layer: int | None = None):
        where = "" if layer is None else f" in layer {layer}"
        super().__init__(f"{count} key/value entries{where} exceed float16's range (65504) and would be stored as "
                         "inf in the float16 KV cache; run with --cache-type f32 (load_model(cache_type='f32'))")
        self.count = count
