"""The draft models an engine's drafters run (draft-simple), each loaded once per engine.

    models = DraftModels(target)
    draft = models.load("qwen2.5-coder-0.5b")   # the same Model object on every later call
"""

from __future__ import annotations

from specdec.model.load import Model, load_model


class DraftModels:
    """Draft models by name or path, loaded on first use in the target's weight format (a target running on
    its GGUF file's own blocks gets a draft in the draft's default: its blocks, or int8), on the target's
    device."""

    def __init__(self, target: Model):
        self.target = target
        self._loaded: dict[str, Model] = {}

    def load(self, name_or_path: str) -> Model:
        if name_or_path not in self._loaded:
            fmt = self.target.info.weights_dtype
            self._loaded[name_or_path] = load_model(name_or_path, None if fmt == "gguf" else fmt,
                                                    progress=False, device=self.target.info.device)
        return self._loaded[name_or_path]
