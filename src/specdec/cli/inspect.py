"""specdec inspect: what a checkpoint is and which speculative methods specdec can run for it.

Reads the file's header and tensor names only (no weights are built), so it is fast:

    specdec inspect qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b
    specdec inspect ./my-model-folder --json

The checkpoint facts come from model/checkpoint_facts.py (MTP layers declared, present, or saved beside
the model), the drafter's from drafters/describe.py, and the auto line from the same
engine/spec_request.build_spec that generate runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.bench.memory import default_kv_cache, estimate_weight_bytes, gguf_tensor_bytes, kv_bytes_per_token
from specdec.cache.recurrent import HISTORY
from specdec.drafters import registry
from specdec.drafters.describe import describe_drafter
from specdec.drafters.mtp import shipped_head_for
from specdec.engine.auto import runnable_model_drafters
from specdec.engine.spec_request import AutoTarget, SpecRequest, build_spec
from specdec.model.errors import ModelFileError
from specdec.model.checkpoint_facts import assistant_note, mtp_info, param_count, raw_checkpoint, target_facts
from specdec.model.gemma4_checkpoint import FAMILY_NOTE as GEMMA4_NOTE
from specdec.model.gemma4_checkpoint import layout_summary
from specdec.model.linear import WEIGHT_FORMATS
from specdec.model.load import open_checkpoint, weights_format_for
from specdec.model import catalogue
from specdec.model.qwen35_checkpoint import FAMILY_NOTES

DRAFT_MODEL = registry.with_flag("draft_model")[0]  # what a plain language model given with -md drafts as
MTP = registry.kind_of_head("mtp")


# -- the report ---------------------------------------------------------------------------------
def inspect_model(name_or_path: str, draft: str | None = None, weights: str | None = None) -> dict:
    """Everything `specdec inspect` prints, as a dict (the --json output). weights: the in-memory format
    (None: what specdec loads the model in by default, model/load.py weights_format_for)."""
    path = Path(catalogue.resolve(name_or_path))
    target_weights = weights_format_for(path, weights)
    report: dict = {"model": name_or_path, "path": str(path),
                    "sha256": catalogue.cached_sha256(path) if path.is_file() else None,
                    "file_bytes": path.stat().st_size if path.is_file() else
                    sum(f.stat().st_size for f in path.glob("*.safetensors"))}
    try:
        checkpoint, tokenizer = open_checkpoint(path)
        runnable, why = True, None
    except ModelFileError as exc:
        checkpoint, tokenizer = raw_checkpoint(path), None
        runnable, why = False, str(exc)
    report["runnable"] = runnable
    report["not_runnable_reason"] = why
    c = getattr(checkpoint, "config", None)
    report["architecture"] = c.arch if c is not None else checkpoint.arch
    if report["architecture"] in FAMILY_NOTES:  # what runs of it, what lights up, what checked it
        report["family_note"] = FAMILY_NOTES[report["architecture"]]
    report["format"] = "hf-folder" if path.is_dir() else "gguf"
    report["parameters"] = param_count(checkpoint)
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
    if c is not None and c.gemma4 is not None:  # its MTP drafter is a checkpoint of its own
        report["config"]["gemma4"] = layout_summary(c)
        report["family_note"] = GEMMA4_NOTE
        mtp = {**mtp, "note": assistant_note(path, draft)}
    report["mtp"] = mtp
    if c is not None:
        report["memory"] = {
            "weights_bytes": {fmt: b for fmt in WEIGHT_FORMATS
                              if (b := estimate_weight_bytes(c, fmt, gguf_tensor_bytes(checkpoint))) is not None},
            "weights_format": target_weights,
            "kv_cache": default_kv_cache(target_weights),
            "kv_bytes_per_1k_tokens": kv_bytes_per_token(c, default_kv_cache(target_weights)) * 1024,
        }
        if c.linear_attention is not None:  # a hybrid keeps the states of a sequence's last lengths (rollback)
            report["memory"]["recurrent_bytes_per_sequence"] = (HISTORY + 1) * c.recurrent_state_bytes()

    drafter = None
    if draft is not None:
        if not runnable:
            drafter = {"path": draft, "kind": None, "compatible": False, "reason": "the target cannot be loaded"}
        else:
            d = describe_drafter(catalogue.resolve(draft), checkpoint, tokenizer, name_or_path, draft)
            drafter = {k: d[k] for k in ("kind", "compatible", "reason")}
            drafter["path"] = draft
            if d.get("block"):
                drafter["block"] = d["block"]
            dc = getattr(d["checkpoint"], "config", None)
            if dc is not None:
                drafter["parameters"] = param_count(d["checkpoint"])
                # as the engine loads a draft: the target's format, or its own default beside a gguf target
                dfmt = weights_format_for(catalogue.resolve(draft), None if target_weights == "gguf" else target_weights)
                drafter["weights_bytes"] = estimate_weight_bytes(dc, dfmt, gguf_tensor_bytes(d["checkpoint"]))
                drafter["weights_format"] = dfmt
                drafter["kv_bytes_per_1k_tokens"] = kv_bytes_per_token(dc, default_kv_cache(dfmt)) * 1024
                report["memory"]["drafter_bytes"] = drafter["weights_bytes"]
                report["memory"]["drafter_weights_format"] = dfmt
                report["memory"]["drafter_kv_bytes_per_1k_tokens"] = drafter["kv_bytes_per_1k_tokens"]
    report["drafter"] = drafter

    methods = []
    if runnable:
        for name in registry.model_free_kinds():
            methods.append({"method": name, "runs": True, "note": "model-free"})
    if drafter is None:
        methods.append({"method": DRAFT_MODEL, "runs": False, "note": "no draft model given (--draft-model)"})
    elif drafter["kind"] == DRAFT_MODEL:
        note = "same tokenizer" if drafter["compatible"] else (
            f"{drafter['reason']}" + ("" if "cannot load" in (drafter["reason"] or "") else
                                     "; runs only with --spec-cross-tokenizer"))
        methods.append({"method": DRAFT_MODEL, "runs": bool(drafter["compatible"] and runnable), "note": note})
    runnable_models = runnable_model_drafters()
    facts = target_facts(checkpoint, path, name_or_path, target_weights)  # an MTP head beside the model counts
    # heads shipped with specdec for this model, which --spec-type <kind> runs without -md (as generate does)
    shipped = {e.kind: head for e in registry.entries()
               if e.head and c is not None and (head := shipped_head_for(e.head, name_or_path, path, checkpoint))}
    if MTP in shipped and not facts.mtp_weights:
        methods.append({"method": MTP, "runs": runnable and MTP in runnable_models,
                        "note": f"MTP head shipped with specdec, {shipped[MTP]} (used without -md)"})
    elif facts.mtp_weights or facts.mtp_declared:
        if not facts.mtp_weights:
            note = "the config declares MTP layers but the file lacks their weights"
        elif MTP not in runnable_models:
            note = "model declares MTP but specdec cannot run it yet"
        else:
            note = facts.mtp_source or "MTP layers present"
        runs = runnable and facts.mtp_weights and MTP in runnable_models
        if facts.mtp_weights and not runnable:
            note += "; the model itself cannot run here"
        methods.append({"method": MTP, "runs": runs, "note": note})
    if drafter is not None and drafter["kind"] not in (None, DRAFT_MODEL):
        kind = drafter["kind"]
        if kind not in runnable_models:
            note = f"drafter given; specdec cannot run {kind} yet"
        elif not drafter["compatible"]:
            note = f"drafter given, but {drafter['reason']}"
        else:
            note = "drafter given"
        methods.append({"method": kind, "note": note,
                        "runs": runnable and kind in runnable_models and bool(drafter["compatible"])})
    for kind, head in shipped.items():
        if kind != MTP and not any(m["method"] == kind for m in methods):
            methods.append({"method": kind, "runs": runnable and kind in runnable_models,
                            "note": f"head shipped with specdec, {head} (used without -md)"})
    report["methods"] = methods
    if runnable:  # what `generate --spec-type auto [-md DRAFT]` would run
        spec, reasons = build_spec(SpecRequest(auto=True, draft_model=draft),
                                   AutoTarget(checkpoint, tokenizer, path, name_or_path, target_weights))
        report["auto"] = {"types": list(spec.types), "method": spec.method,
                          "reasons": [r.removeprefix("auto: ") for r in reasons]}
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
    if r.get("family_note"):
        lines.append(f"              {r['family_note']}")
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
        if c.get("gemma4"):
            lines.append(f"layers        {c['gemma4']}")
    if r.get("tokenizer"):
        t = r["tokenizer"]
        lines.append(f"tokenizer     {t['kind']}, {t['vocab_size']} tokens, BOS {t['bos']!r}, EOS {t['eos']}, "
                     f"chat template {'yes' if t['chat_template'] else 'no'}")
    lines.append(f"MTP           {r['mtp']['note']}")
    if r.get("memory"):
        m = r["memory"]
        w = ", ".join(f"{fmt} {_mb(b)}" for fmt, b in m["weights_bytes"].items())
        lines.append(f"memory        weights: {w}; loaded as {m['weights_format']}")
        lines.append(f"              KV cache: {_mb(m['kv_bytes_per_1k_tokens'])} per 1k tokens ({m['kv_cache']}, "
                     "the CPU default)")
        if "recurrent_bytes_per_sequence" in m:
            lines.append(f"              recurrent state: {_mb(m['recurrent_bytes_per_sequence'])} per sequence (the "
                         f"states of its last {HISTORY} lengths, for rollback)")
        if "drafter_bytes" in m:
            lines.append(f"              drafter: {_mb(m['drafter_bytes'])} weights ({m['drafter_weights_format']}) + "
                         f"{_mb(m['drafter_kv_bytes_per_1k_tokens'])} KV per 1k tokens")
    d = r.get("drafter")
    if d is not None:
        state = "compatible" if d["compatible"] else f"NOT compatible: {d['reason']}"
        lines.append(f"drafter       {d['path']}: {d['kind']}, {state}")
        b = d.get("block")
        if b:
            extra = "".join([f", Markov rank {b['markov_rank']} ({b['markov_head']})" if b["markov_rank"] else "",
                             ", confidence head (--spec-draft-p-min)" if b["confidence_head"] else ""])
            n = b["drafts_per_block"]
            lines.append(f"              {b['layout']} block of {b['block_size']} ({n} drafts a step: "
                         f"--spec-draft-n-max {n}), {b['drafter_layers']} layers on target layers "
                         f"{b['target_layer_ids']}, mask token {b['mask_token_id']}{extra}")
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
    p.add_argument("--weights", default=None, choices=list(WEIGHT_FORMATS),
                   help="in-memory weight format the drafter estimate uses (default: the drafter's own, as "
                        "specdec loads it)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_inspect)

