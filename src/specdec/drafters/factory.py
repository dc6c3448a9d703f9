"""Builds the drafter a spec-type name asks for, with the arguments it needs.

Model-free drafters come from the registry with their defaults; model drafters
need the target (for compatibility checks and shared weights) and are built here.
"""

from __future__ import annotations

from specdec.drafters import registry
from specdec.engine.config import SpecConfig


class DrafterFactory:
    def __init__(self, target, max_len: int = 4096):
        self.target = target
        self.max_len = max_len
        self._draft_models: dict[str, object] = {}

    def load_draft_model(self, name_or_path: str):
        from specdec.model.load import load_model

        if name_or_path not in self._draft_models:
            self._draft_models[name_or_path] = load_model(name_or_path, self.target.info.weights_dtype,
                                                          progress=False)
        return self._draft_models[name_or_path]

    def __call__(self, name: str, spec: SpecConfig):
        if name == "draft-simple":
            from specdec.drafters.draft_model import CrossTokenizerDrafter, DraftModelDrafter, check_compatible

            draft = self.load_draft_model(spec.draft_model)
            if spec.cross_tokenizer:
                return CrossTokenizerDrafter(draft, self.target.tokenizer, spec.draft_p_min, self.max_len)
            check_compatible(self.target, draft)
            return DraftModelDrafter(draft, self.target.config.vocab_size, spec.draft_p_min, self.max_len)
        if name == "draft-mtp":
            from specdec.drafters.mtp import make_mtp_drafter

            return make_mtp_drafter(self.target, spec.draft_p_min, self.max_len, spec.tree_topk,
                                    spec.effective_tree_budget)
        if name == "draft-eagle3":
            from specdec.drafters.eagle3 import make_eagle3_drafter

            return make_eagle3_drafter(self.target, spec.draft_model, spec.draft_p_min, self.max_len, spec.tree_topk,
                                       spec.effective_tree_budget)
        if name.startswith("draft-"):
            raise ValueError(f"--spec-type {name} is not available in this build of specdec yet")
        return registry.create(name)
