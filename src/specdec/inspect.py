"""specdec inspect: what a checkpoint is and which speculative methods specdec can run for it.

Reads the file's header and tensor names only (no weights are built), so it is fast:

    specdec inspect qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b
    specdec inspect ./my-model-folder --json

MTP layers are looked for in the config (num_nextn_predict_layers, mtp_num_hidden_layers;
GGUF: <arch>.nextn_predict_layers) and in the tensors (GGUF blk.N.nextn.*, or blocks past the
main ones; HF model.layers.N.* past num_hidden_layers, mtp.*, model.mtp_layers.*). A config
that names MTP layers whose weights the file lacks is reported as such: GGUF conversions
often drop them.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

from specdec.model.errors import ModelFileError

_HF_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
_DRAFTER_KINDS = (("eagle3", "draft-eagle3"), ("eagle", "draft-eagle3"), ("dflash", "draft-dflash"),
                  ("dspark", "draft-dspark"))


# -- checkpoint facts ---------------------------------------------------------------------------
def mtp_info(checkpoint) -> dict:
    """{"declared", "config_key", "weights_present", "tensors", "examples", "note"} for a checkpoint.

    checkpoint: a GGUFModel or HFModel (model/gguf_loader.py, model/hf_loader.py) or a raw
    description from `_raw_checkpoint` (same attributes: config or raw_config/metadata, names).
    """
    raw = getattr(checkpoint, "raw_config", None)
    metadata = getattr(checkpoint, "metadata", None)
    declared, key = 0, None
    if raw is not None:  # HF folder
        for k in _HF_MTP_KEYS:
            if raw.get(k):
                declared, key = int(raw[k]), k
                break
        layers = int(raw.get("num_hidden_layers") or 0)
        names = checkpoint.names()
        hits = [n for n in names if n.startswith(("mtp.", "model.mtp_layers.", "model.mtp.")) or
                ((m := re.match(r"model\.layers\.(\d+)\.", n)) and int(m.group(1)) >= layers)]
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


def _param_count(checkpoint) -> int:
    tensors = getattr(checkpoint, "_tensors", None)
    if tensors is not None:  # GGUF: every tensor in the file, MTP included
        reader = getattr(checkpoint, "reader", None)
        if reader is not None:
            return sum(int(t.n_elements) for t in reader.tensors)
        return sum(int(t.n_elements) for t in tensors.values())
    from safetensors import safe_open

    total = 0
    by_file: dict = {}
    for name, file in checkpoint._files.items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as f:
            for name in names:
                n = 1
                for d in f.get_slice(name).get_shape():
                    n *= d
                total += n
    return total


def _raw_checkpoint(path: Path) -> SimpleNamespace:
    """What can be read from a checkpoint specdec cannot run (another architecture): names, config, sizes."""
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ModelFileError(path, "no config.json in this folder")
        raw = json.loads(cfg.read_text())
        from safetensors import safe_open

        files = {}
        for shard in sorted(path.glob("*.safetensors")):
            with safe_open(shard, framework="pt") as f:
                for name in f.keys():
                    files[name] = shard
        return SimpleNamespace(raw_config=raw, _files=files, names=lambda: list(files), arch=raw.get("model_type"),
                               quant="safetensors", context_length=raw.get("max_position_embeddings"))
    from gguf import GGUFReader

    from specdec.model.gguf_loader import _FILE_TYPES

    try:
        reader = GGUFReader(path)
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
                           quant=_FILE_TYPES.get(meta.get("general.file_type"), str(meta.get("general.file_type"))),
                           context_length=meta.get(f"{arch}.context_length"))


def _drafter_kind_from_config(raw: dict) -> str | None:
    text = " ".join([str(raw.get("model_type", ""))] + [str(a) for a in raw.get("architectures") or []]).lower()
    for needle, kind in _DRAFTER_KINDS:
        if needle in text:
            return kind
    return None


def _head_mismatch(raw: dict, target_config, target_name, draft_name) -> str | None:
    """Why a drafter head trained on some target's hidden states cannot serve this target (None: it can)."""
    if target_config is None:
        return None
    from specdec.drafters.draft_model import MAX_VOCAB_PADDING

    vocab = raw.get("vocab_size")
    if vocab is not None and abs(int(vocab) - target_config.vocab_size) > MAX_VOCAB_PADDING:
        return (f"{draft_name} was trained for a vocabulary of {vocab} tokens; the target {target_name} has "
                f"{target_config.vocab_size}")
    hidden = raw.get("target_hidden_size") or raw.get("hidden_size")
    if hidden is not None and int(hidden) != target_config.hidden_size:
        return (f"{draft_name} expects target hidden size {hidden}; the target {target_name} has "
                f"{target_config.hidden_size}")
    return None


def describe_drafter(path, target_checkpoint, target_tokenizer, target_name: str = "target",
                     draft_name: str | None = None) -> dict:
    """{"path", "kind", "compatible", "reason", "checkpoint", "tokenizer"} for a drafter given by the user.

    kind is "draft-eagle3" / "draft-dflash" / "draft-dspark" for heads trained on a target's hidden
    states (recognised from config.json's model_type/architectures, or the GGUF architecture), else
    "draft-simple" (a plain smaller model), checked for tokenizer compatibility with the target.
    """
    from specdec.model.load import open_checkpoint

    path = Path(path)
    if path.is_dir() and (path / "config.json").is_file():
        raw = json.loads((path / "config.json").read_text())
        kind = _drafter_kind_from_config(raw)
        if kind is not None:
            reason = _head_mismatch(raw, getattr(target_checkpoint, "config", None), target_name, draft_name or path)
            return {"path": str(path), "kind": kind, "compatible": reason is None, "reason": reason,
                    "checkpoint": None, "tokenizer": None}
    try:
        checkpoint, tokenizer = open_checkpoint(path)
    except ModelFileError as exc:
        raw = _raw_checkpoint(path)
        kind = _drafter_kind_from_config(getattr(raw, "raw_config", None) or {"model_type": raw.arch})
        if kind is None:
            return {"path": str(path), "kind": "draft-simple", "compatible": False,
                    "reason": f"specdec cannot load it: {exc}", "checkpoint": None, "tokenizer": None}
        return {"path": str(path), "kind": kind, "compatible": True, "reason": None, "checkpoint": None,
                "tokenizer": None}
    ok, reason = draft_compatibility(target_checkpoint, target_tokenizer, target_name, checkpoint, tokenizer,
                                     draft_name or str(path))
    return {"path": str(path), "kind": "draft-simple", "compatible": ok, "reason": reason, "checkpoint": checkpoint,
            "tokenizer": tokenizer}


def draft_compatibility(target_checkpoint, target_tokenizer, target_name, draft_checkpoint, draft_tokenizer,
                        draft_name) -> tuple[bool, str | None]:
    """drafters/draft_model.check_compatible on unbuilt checkpoints: (ok, the reason when not)."""
    from specdec.drafters.draft_model import DraftCompatibilityError, check_compatible

    def shim(checkpoint, tokenizer, name):
        return SimpleNamespace(tokenizer=tokenizer, config=checkpoint.config, info=SimpleNamespace(name=name))

    try:
        check_compatible(shim(target_checkpoint, target_tokenizer, target_name),
                         shim(draft_checkpoint, draft_tokenizer, draft_name))
    except DraftCompatibilityError as exc:
        return False, str(exc)
    return True, None


# -- the report ---------------------------------------------------------------------------------
def inspect_model(name_or_path: str, draft: str | None = None, weights: str = "int8") -> dict:
    """Everything `specdec inspect` prints, as a dict (the --json output)."""
    from specdec.bench.memory import estimate_weight_bytes, kv_bytes_per_token
    from specdec.drafters import registry
    from specdec.engine.auto import DrafterFacts, TargetFacts, choose_auto
    from specdec.model.linear import WEIGHT_FORMATS
    from specdec.model.load import open_checkpoint
    from specdec.model.registry import cached_sha256, resolve

    path = Path(resolve(name_or_path))
    report: dict = {"model": name_or_path, "path": str(path),
                    "sha256": cached_sha256(path) if path.is_file() else None,
                    "file_bytes": path.stat().st_size if path.is_file() else
                    sum(f.stat().st_size for f in path.glob("*.safetensors"))}
    try:
        checkpoint, tokenizer = open_checkpoint(path)
        runnable, why = True, None
    except ModelFileError as exc:
        checkpoint, tokenizer = _raw_checkpoint(path), None
        runnable, why = False, str(exc)
    report["runnable"] = runnable
    report["not_runnable_reason"] = why
    c = getattr(checkpoint, "config", None)
    report["architecture"] = c.arch if c is not None else checkpoint.arch
    report["format"] = "hf-folder" if path.is_dir() else "gguf"
    report["parameters"] = _param_count(checkpoint)
    report["quantization"] = checkpoint.quant
    if getattr(checkpoint, "tensor_types", None):
        types: dict[str, int] = {}
        for t in checkpoint.tensor_types.values():
            types[t] = types.get(t, 0) + 1
        report["tensor_types"] = dict(sorted(types.items(), key=lambda kv: -kv[1]))
    report["context_length"] = c.context_length if c is not None else checkpoint.context_length
    if c is not None:
        report["config"] = {"layers": c.num_layers, "hidden_size": c.hidden_size, "heads": c.num_heads,
                            "kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
                            "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
                            "tied_embeddings": c.tie_embeddings}
    if tokenizer is not None:
        report["tokenizer"] = {
            "kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size, "bos_id": tokenizer.bos_id,
            "bos": tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else None,
            "eos_ids": tokenizer.eos_ids, "eos": [tokenizer.token_text(i) for i in tokenizer.eos_ids],
            "add_bos": tokenizer.add_bos, "chat_template": bool(tokenizer.chat_template)}
    mtp = mtp_info(checkpoint)
    report["mtp"] = mtp
    if c is not None:
        report["memory"] = {
            "weights_bytes": {fmt: estimate_weight_bytes(c, fmt) for fmt in WEIGHT_FORMATS},
            "weights_format": weights,
            "kv_bytes_per_1k_tokens": kv_bytes_per_token(c) * 1024,
        }

    drafter = None
    if draft is not None:
        if not runnable:
            drafter = {"path": draft, "kind": None, "compatible": False, "reason": "the target cannot be loaded"}
        else:
            d = describe_drafter(resolve(draft), checkpoint, tokenizer, name_or_path, draft)
            drafter = {k: d[k] for k in ("kind", "compatible", "reason")}
            drafter["path"] = draft
            dc = getattr(d["checkpoint"], "config", None)
            if dc is not None:
                drafter["parameters"] = _param_count(d["checkpoint"])
                drafter["weights_bytes"] = estimate_weight_bytes(dc, weights)
                drafter["kv_bytes_per_1k_tokens"] = kv_bytes_per_token(dc) * 1024
                report["memory"]["drafter_bytes"] = drafter["weights_bytes"]
                report["memory"]["drafter_kv_bytes_per_1k_tokens"] = drafter["kv_bytes_per_1k_tokens"]
    report["drafter"] = drafter

    methods = []
    if runnable:
        for name in registry.names():
            methods.append({"method": name, "runs": True, "note": "model-free"})
    if drafter is None:
        methods.append({"method": "draft-simple", "runs": False, "note": "no draft model given (--draft-model)"})
    elif drafter["kind"] == "draft-simple":
        note = "same tokenizer" if drafter["compatible"] else (
            f"{drafter['reason']}" + ("" if "cannot load" in (drafter["reason"] or "") else
                                     "; runs only with --spec-cross-tokenizer"))
        methods.append({"method": "draft-simple", "runs": bool(drafter["compatible"] and runnable), "note": note})
    from specdec.engine.auto import RUNNABLE_MODEL_DRAFTERS

    if mtp["weights_present"] or mtp["declared"]:
        if not mtp["weights_present"]:
            note = "the config declares MTP layers but the file lacks their weights"
        elif "draft-mtp" in RUNNABLE_MODEL_DRAFTERS:
            note = "MTP layers present"
        else:
            note = "model declares MTP but specdec cannot run it yet"
        runs = runnable and mtp["weights_present"] and "draft-mtp" in RUNNABLE_MODEL_DRAFTERS
        methods.append({"method": "draft-mtp", "runs": runs, "note": note})
    if drafter is not None and drafter["kind"] not in (None, "draft-simple"):
        kind = drafter["kind"]
        if kind not in RUNNABLE_MODEL_DRAFTERS:
            note = f"drafter given; specdec cannot run {kind} yet"
        elif not drafter["compatible"]:
            note = f"drafter given, but {drafter['reason']}"
        else:
            note = "drafter given"
        methods.append({"method": kind, "note": note,
                        "runs": runnable and kind in RUNNABLE_MODEL_DRAFTERS and bool(drafter["compatible"])})
    report["methods"] = methods
    if runnable:
        facts = TargetFacts(name_or_path, mtp["declared"], mtp["weights_present"], weights)
        dfacts = None if drafter is None or drafter["kind"] is None else DrafterFacts(
            draft, drafter["kind"], bool(drafter["compatible"]), drafter["reason"] or "")
        spec, reasons = choose_auto(facts, dfacts)
        report["auto"] = {"types": list(spec.types), "method": spec.method, "reasons": reasons}
    return report


def _mb(n) -> str:
    return f"{n / 1e6:,.1f} MB"


def format_report(r: dict) -> str:
    lines = [f"model         {r['model']}", f"path          {r['path']}"]
    if r.get("sha256"):
        lines.append(f"sha256        {r['sha256']}")
    lines.append(f"file          {r['format']}, {_mb(r['file_bytes'])}")
    run = "yes" if r["runnable"] else f"NO: {r['not_runnable_reason']}"
    lines.append(f"runs here     {run}")
    lines.append(f"architecture  {r['architecture']}")
    lines.append(f"parameters    {r['parameters']:,} ({r['parameters'] / 1e9:.2f} B)")
    q = r["quantization"]
    if r.get("tensor_types"):
        q += " (" + ", ".join(f"{k} x{v}" for k, v in r["tensor_types"].items()) + ")"
    lines.append(f"quantization  {q}")
    lines.append(f"context       {r['context_length']} tokens")
    if r.get("config"):
        c = r["config"]
        lines.append(f"shape         {c['layers']} layers, hidden {c['hidden_size']}, heads {c['heads']} "
                     f"(kv {c['kv_heads']}, dim {c['head_dim']}), ffn {c['intermediate_size']}, vocab {c['vocab_size']}"
                     + (", tied embeddings" if c["tied_embeddings"] else ""))
    if r.get("tokenizer"):
        t = r["tokenizer"]
        lines.append(f"tokenizer     {t['kind']}, {t['vocab_size']} tokens, BOS {t['bos']!r}, EOS {t['eos']}, "
                     f"chat template {'yes' if t['chat_template'] else 'no'}")
    lines.append(f"MTP           {r['mtp']['note']}")
    if r.get("memory"):
        m = r["memory"]
        w = ", ".join(f"{fmt} {_mb(b)}" for fmt, b in m["weights_bytes"].items())
        lines.append(f"memory        weights: {w}")
        lines.append(f"              KV cache: {_mb(m['kv_bytes_per_1k_tokens'])} per 1k tokens (float32)")
        if "drafter_bytes" in m:
            lines.append(f"              drafter: {_mb(m['drafter_bytes'])} weights ({m['weights_format']}) + "
                         f"{_mb(m['drafter_kv_bytes_per_1k_tokens'])} KV per 1k tokens")
    d = r.get("drafter")
    if d is not None:
        state = "compatible" if d["compatible"] else f"NOT compatible: {d['reason']}"
        lines.append(f"drafter       {d['path']}: {d['kind']}, {state}")
    else:
        lines.append("drafter       none given (no draft model, EAGLE-3, DFlash or DSpark drafter; see --draft-model)")
    lines.append("methods")
    for m in r["methods"]:
        lines.append(f"  {'yes' if m['runs'] else 'no ':3}  {m['method']:14} {m['note']}")
    if r.get("auto"):
        lines.append(f"auto          {r['auto']['method']}")
        for reason in r["auto"]["reasons"][1:]:
            lines.append(f"              - {reason}")
    return "\n".join(lines)


def cmd_inspect(args) -> int:
    report = inspect_model(args.model, args.draft_model, args.weights)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="describe a model file/folder and the speculative methods it supports")
    p.add_argument("model", help="model name, GGUF file or HF folder")
    p.add_argument("--draft-model", "-md", "--model-draft", dest="draft_model", default=None,
                   help="a draft model or EAGLE-3/DFlash/DSpark drafter to check against the model")
    p.add_argument("--weights", default="int8", choices=["fp32", "bf16", "int8", "int4"],
                   help="in-memory weight format the drafter estimate uses (default int8)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_inspect)


if __name__ == "__main__":  # pragma: no cover
    from specdec.cli import main

    sys.exit(main(["inspect", *sys.argv[1:]]))
