"""Errors meant for people: one sentence naming the thing and what to do."""


class SpecdecError(Exception):
    """Base class; the CLI prints these without a stack trace."""


class ModelFileError(SpecdecError):
    """A model file or folder cannot be used (truncated, corrupt, unsupported)."""

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
