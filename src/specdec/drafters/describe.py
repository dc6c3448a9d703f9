"""What a drafter the user points at is, read from its files (no weights built), and whether
it fits the target: a plain smaller model (draft-simple, checked for tokenizer compatibility)
or a head trained on some target's hidden states (draft-eagle3, draft-dflash, draft-dspark,
recognised from config.json's model_type / architectures or the GGUF architecture).

    facts = drafter_facts("qwen2.5-coder-0.5b", target_checkpoint, target_tokenizer, "qwen2.5-coder-1.5b")
    facts.kind, facts.compatible, facts.reason
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from specdec.drafters import registry
from specdec.drafters.block.config import BlockConfig, DFlashError, fit_problem
from specdec.drafters.draft_model import MAX_VOCAB_PADDING, DraftCompatibilityError, check_compatible
from specdec.drafters.eagle3 import Eagle3Error, check_eagle3_folder
from specdec.drafters.eagle_formats import is_eagle_folder
from specdec.drafters.gemma4_assistant import assistant_mismatch
from specdec.drafters.mtp import mtp_head_mismatch
from specdec.model.catalogue import resolve
from specdec.model.checkpoint_facts import ASSISTANT_TYPE, raw_checkpoint
from specdec.model.errors import ModelFileError
from specdec.model.load import open_checkpoint

_DRAFT_MODEL_KIND = registry.with_flag("draft_model")[0]  # what a plain language model given with -md drafts as



@dataclass(frozen=True)
class DrafterFacts:
    """A drafter the user pointed at (-md / --model-draft)."""
    path: str
    kind: str  # "draft-simple", "draft-mtp" (a trained head), "draft-eagle3", "draft-dflash" or "draft-dspark"
    compatible: bool = True  # same tokenizer as the target (draft-simple), or trained for it
    reason: str = ""  # why not compatible

def head_kind(path) -> str | None:
    """The kind of a hidden-state head folder (config.json names EAGLE-3 / DFlash / DSpark, or is a
    specdec MTP head), else None.

    Reads config.json only; a model name, a GGUF file or a plain model folder gives None."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    try:
        raw = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _kind_from_config(raw, Path(path)) if isinstance(raw, dict) else None


def _kind_from_config(raw: dict, path: Path | None = None) -> str | None:
    """The head kind config.json names; for a folder, also an EAGLE head published under a plain architecture
    (SafeAILab's LlamaForCausalLM heads: eagle_formats.is_eagle_folder)."""
    written = raw.get("specdec")
    if isinstance(written, dict) and written.get("kind") == "mtp":  # `specdec train mtp --out`
        return registry.kind_of_head("mtp")
    text = " ".join([str(raw.get("model_type", ""))] + [str(a) for a in raw.get("architectures") or []]).lower()
    kind = registry.head_kind_of(text)
    if kind is None and path is not None and is_eagle_folder(raw, path):
        kind = registry.kind_of_head("eagle3")
    return kind


def _head_mismatch(raw: dict, target_config, target_name, draft_name, kind: str | None = None,
                   path: Path | None = None) -> str | None:
    """Why a drafter head trained on some target's hidden states cannot serve this target (None: it can)."""
    if target_config is None:
        return None
    if kind == registry.kind_of_head("eagle3") and path is not None:  # the loader's own checks, without building the head
        try:
            check_eagle3_folder(path, target_config, target_name)
        except Eagle3Error as exc:
            return str(exc)
        return None
    if kind == registry.kind_of_head("mtp") and raw.get("model_type") == ASSISTANT_TYPE:  # Gemma 4's assistant
        return assistant_mismatch(raw, target_config, target_name, draft_name)
    if kind == registry.kind_of_head("mtp"):
        if path is not None and not (Path(path) / "model.safetensors").is_file():  # as generate refuses it
            return f"the MTP head {path} has no model.safetensors"
        return mtp_head_mismatch(raw, target_config, target_name, draft_name)
    if kind is not None and registry.entry(kind).block:
        try:
            cfg = BlockConfig.from_json(raw, str(draft_name))
        except DFlashError as exc:
            return str(exc)
        return fit_problem(cfg, target_config, f"the target {target_name}", str(draft_name))
    vocab = raw.get("vocab_size")
    if vocab is not None and abs(int(vocab) - target_config.vocab_size) > MAX_VOCAB_PADDING:
        return (f"{draft_name} was trained for a vocabulary of {vocab} tokens; the target {target_name} has "
                f"{target_config.vocab_size}")
    hidden = raw.get("target_hidden_size") or raw.get("hidden_size")
    if hidden is not None and int(hidden) != target_config.hidden_size:
        return (f"{draft_name} expects target hidden size {hidden}; the target {target_name} has "
                f"{target_config.hidden_size}")
    return None


def block_draft_length(path) -> int | None:
    """Drafts one pass of the DFlash / DSpark drafter in folder `path` gives (None: not such a folder)."""
    cfg = Path(path) / "config.json"
    kind = head_kind(path)
    if kind is None or not registry.entry(kind).block:
        return None
    facts = block_facts(json.loads(cfg.read_text()))
    return None if facts is None else facts["drafts_per_block"]


def block_facts(raw: dict) -> dict | None:
    """What a DFlash / DSpark config.json says about its block (None when specdec cannot read it)."""
    try:
        cfg = BlockConfig.from_json(raw)
    except DFlashError:
        return None
    return {"layout": cfg.layout, "block_size": cfg.block_size, "drafts_per_block": cfg.drafts_per_block,
            "target_layer_ids": list(cfg.target_layer_ids), "drafter_layers": cfg.num_layers,
            "mask_token_id": cfg.mask_token_id, "markov_rank": cfg.markov_rank, "markov_head": cfg.markov_head_type,
            "confidence_head": cfg.confidence_head}


def describe_drafter(path, target_checkpoint, target_tokenizer, target_name: str = "target",
                     draft_name: str | None = None) -> dict:
    """{"path", "kind", "compatible", "reason", "checkpoint", "tokenizer"} for a drafter given by the user.

    checkpoint/tokenizer are the draft model's (draft-simple only), for callers that report its size;
    a DFlash / DSpark folder adds "block" (block_facts).
    """
    path = Path(path)
    kind = head_kind(path) if path.is_dir() else None
    if kind is not None:  # head_kind read config.json as a JSON object
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
        reason = _head_mismatch(raw, getattr(target_checkpoint, "config", None), target_name, draft_name or path,
                                kind, path)
        return {"path": str(path), "kind": kind, "compatible": reason is None, "reason": reason,
                "checkpoint": None, "tokenizer": None, "block": block_facts(raw) if registry.entry(kind).block else None}
    try:
        checkpoint, tokenizer = open_checkpoint(path)
    except ModelFileError as exc:
        raw = raw_checkpoint(path)
        kind = _kind_from_config(getattr(raw, "raw_config", None) or {"model_type": raw.arch})
        if kind is None:
            return {"path": str(path), "kind": _DRAFT_MODEL_KIND, "compatible": False,
                    "reason": f"specdec cannot load it: {exc}", "checkpoint": None, "tokenizer": None}
        return {"path": str(path), "kind": kind, "compatible": True, "reason": None, "checkpoint": None,
                "tokenizer": None}
    ok, reason = draft_compatibility(target_checkpoint, target_tokenizer, target_name, checkpoint, tokenizer,
                                     draft_name or str(path))
    return {"path": str(path), "kind": _DRAFT_MODEL_KIND, "compatible": ok, "reason": reason, "checkpoint": checkpoint,
            "tokenizer": tokenizer}


def drafter_facts(name_or_path: str, target_checkpoint, target_tokenizer, target_name: str = "target"
                  ) -> DrafterFacts:
    """describe_drafter for auto: the kind, and whether it fits the target."""
    d = describe_drafter(resolve(name_or_path), target_checkpoint, target_tokenizer, target_name, name_or_path)
    return DrafterFacts(name_or_path, d["kind"], d["compatible"], d["reason"] or "")


def draft_compatibility(target_checkpoint, target_tokenizer, target_name, draft_checkpoint, draft_tokenizer,
                        draft_name) -> tuple[bool, str | None]:
    """drafters/draft_model.check_compatible on unbuilt checkpoints: (ok, the reason when not)."""
    def shim(checkpoint, tokenizer, name):
        return SimpleNamespace(tokenizer=tokenizer, config=checkpoint.config, info=SimpleNamespace(name=name))

    try:
        check_compatible(shim(target_checkpoint, target_tokenizer, target_name),
                         shim(draft_checkpoint, draft_tokenizer, draft_name))
    except DraftCompatibilityError as exc:
        return False, str(exc)
    return True, None
