"""Checkpoint facts read from a file's header and tensor names, no weights built: MTP layers
(declared, present, or saved beside the model by `specdec train mtp`), parameter counts, and
what can be read of a checkpoint specdec cannot run. Auto, inspect and export-config use them.

MTP layers are looked for in the config (num_nextn_predict_layers, mtp_num_hidden_layers;
GGUF: <arch>.nextn_predict_layers) and in the tensors (GGUF blk.N.nextn.*, or blocks past the
main ones; HF model.layers.N.* past num_hidden_layers, mtp.*, model.mtp_layers.*). A config
that names MTP layers whose weights the file lacks is reported as such: GGUF conversions
often drop them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from specdec.model.errors import ModelFileError
from specdec.model.files import read_json_object, safetensors_header, safetensors_names
from specdec.model.gguf_loader import quant_label
from specdec.model.gguf_reader import reader_class

_HF_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


@dataclass(frozen=True)
class TargetFacts:
    """What auto needs to know about the target model."""

    name: str
    mtp_declared: int = 0  # MTP layers named by the config
    mtp_weights: bool = False  # whether the checkpoint (or a head saved beside it) holds MTP weights
    weights_format: str = "int8"  # in-memory format the target runs in
    mtp_source: str = ""  # where the MTP weights are, when not in the checkpoint (a head beside the model)


def sidecar_path(model_path) -> Path:
    """Where `specdec train mtp` saves a head so that auto finds it: `<model path>.mtp/`."""
    p = Path(model_path)
    return p.with_name(p.name + ".mtp")


ASSISTANT_TYPE = "gemma4_assistant"  # Gemma 4's MTP drafter, a checkpoint of its own (drafters/gemma4_assistant.py)


def is_assistant_folder(path) -> bool:
    """Whether `path` is a folder whose config.json names model_type gemma4_assistant."""
    cfg = Path(path) / "config.json"
    try:
        return cfg.is_file() and read_json_object(cfg).get("model_type") == ASSISTANT_TYPE
    except ModelFileError:  # a config.json that is no JSON object is not an assistant's
        return False


def assistant_beside(model_path) -> Path | None:
    """A Gemma 4 assistant folder beside the model: `<model>-assistant` (the Hugging Face repositories' naming)
    or `<model>.mtp`; None when there is none."""
    p = Path(model_path)
    return next((f for f in (p.with_name(p.name + "-assistant"), sidecar_path(p)) if is_assistant_folder(f)), None)


def assistant_note(model_path, draft=None) -> str:
    """What a Gemma 4 target's MTP drafter is and where it was found, for people (inspect's MTP line)."""
    found = assistant_beside(model_path)
    where = (f"given with -md ({draft})" if draft is not None and is_assistant_folder(draft) else
             f"found beside the model ({found})" if found is not None else
             f"none given (-md FOLDER, or put it beside the model as {Path(model_path).name}-assistant)")
    return f"Gemma 4's MTP drafter is a separate assistant checkpoint (gemma4_assistant): {where}; draft-mtp runs it"


def target_facts(checkpoint, model_path, name: str, weights_format: str) -> TargetFacts:
    """TargetFacts of a checkpoint (opened or raw); an MTP head beside the model counts as its own MTP layers, and
    so does a Gemma 4 target's assistant beside it."""
    mtp = mtp_info(checkpoint)
    present, source = mtp["weights_present"], ""
    sidecar = sidecar_path(model_path)
    helper = assistant_beside(model_path) if getattr(getattr(checkpoint, "config", None), "gemma4", None) else None
    if helper is not None:
        present, source = True, f"Gemma 4 assistant beside the model ({helper})"
    if not present and (sidecar / "model.safetensors").is_file():
        try:
            safetensors_names(sidecar / "model.safetensors")
            present, source = True, f"MTP head beside the model ({sidecar})"
        except ModelFileError:  # a damaged head (an interrupted `specdec train mtp`) is not offered to auto
            pass
    return TargetFacts(name, mtp["declared"], present, weights_format, source)


def mtp_info(checkpoint) -> dict:
    """{"declared", "config_key", "weights_present", "tensors", "examples", "note"} for a checkpoint.

    checkpoint: a GGUFModel or HFModel (model/gguf_loader.py, model/hf_loader.py) or a raw
    description from `raw_checkpoint` (same attributes: raw_config or metadata, names()).
    """
    raw = getattr(checkpoint, "raw_config", None)
    metadata = getattr(checkpoint, "metadata", None)
    declared, key = 0, None
    if raw is not None:  # HF folder
        for k in _HF_MTP_KEYS:
            if raw.get(k):
                declared, key = int(raw[k]), k
                break
        layers = raw.get("num_hidden_layers")  # unknown: no layer counts as past the main ones
        layers = layers if isinstance(layers, int) and layers > 0 else None
        names = checkpoint.names()
        hits = [n for n in names if n.startswith(("mtp.", "model.mtp_layers.", "model.mtp.")) or
                (layers and (m := re.match(r"model\.layers\.(\d+)\.", n)) and int(m.group(1)) >= layers)]
    else:  # GGUF
        arch = (metadata or {}).get("general.architecture")
        k = f"{arch}.nextn_predict_layers"
        if (metadata or {}).get(k):
            declared, key = int(metadata[k]), k
        blocks = int((metadata or {}).get(f"{arch}.block_count") or 0)
        main = blocks - declared
        names = list(getattr(checkpoint, "gguf_names", None) or checkpoint.names())
        hits = [n for n in names if ".nextn." in n or
                (declared and (m := re.match(r"blk\.(\d+)\.", n)) and int(m.group(1)) >= main)]
    present = bool(hits)
    if declared and not present:
        note = f"the config declares {declared} MTP layer(s) ({key}) but the file has no MTP weights"
    elif present and not declared:
        note = f"the file has {len(hits)} MTP-like tensors but the config declares no MTP layers"
    elif present:
        note = f"{declared} MTP layer(s) with weights ({len(hits)} tensors)"
    else:
        note = "no MTP layers"
    return {"declared": declared, "config_key": key, "weights_present": present, "tensors": len(hits),
            "examples": hits[:3], "note": note}


def param_count(checkpoint) -> int:
    """Elements in every tensor of the checkpoint (MTP layers included)."""
    tensors = getattr(checkpoint, "_tensors", None)
    if tensors is not None:  # GGUF
        reader = getattr(checkpoint, "reader", None)
        if reader is not None:
            return sum(int(t.n_elements) for t in reader.tensors)
        return sum(int(t.n_elements) for t in tensors.values())
    files = set(checkpoint._files.values())
    shapes = {name: shape for file in files for name, (_, shape) in safetensors_header(file).items()}
    stored = getattr(checkpoint, "_stored", {})  # a published Qwen3.5 folder: text tensors renamed (hf_loader.py)
    return sum(math.prod(shapes[stored.get(name, name)]) for name in checkpoint._files)


def raw_checkpoint(path: Path) -> SimpleNamespace:
    """What can be read from a checkpoint specdec cannot run (another architecture): names, config, sizes."""
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ModelFileError(path, "no config.json in this folder")
        raw = read_json_object(cfg)
        headers = {shard: safetensors_header(shard) for shard in sorted(path.glob("*.safetensors"))}
        files = {name: shard for shard, header in headers.items() for name in header}
        # the matrices' dtype as stored (F8_E4M3, BF16, ...): "safetensors" named the format, not the weights
        kinds = [dtype for header in headers.values() for name, (dtype, shape) in header.items()
                 if name.endswith("weight") and len(shape) == 2]
        return SimpleNamespace(raw_config=raw, _files=files, names=lambda: list(files), arch=raw.get("model_type"),
                               quant=quant_label(None, kinds) if kinds else "unknown",
                               context_length=raw.get("max_position_embeddings"))

    try:
        reader = reader_class()(path)
    except Exception as exc:
        raise ModelFileError(path, f"not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    meta = {}
    for key, f in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.split(".")[-1] in ("tokens", "scores", "token_type", "merges"):
            continue
        try:
            meta[key] = f.contents()
        except Exception:
            meta[key] = None
    arch = meta.get("general.architecture")
    names = [t.name for t in reader.tensors]
    return SimpleNamespace(metadata=meta, gguf_names=names, names=lambda: names, reader=reader,
                           _tensors={t.name: t for t in reader.tensors}, arch=arch,
                           quant=quant_label(meta.get("general.file_type"),
                                             [t.tensor_type.name for t in reader.tensors if len(t.shape) == 2]),
                           context_length=meta.get(f"{arch}.context_length"))
