"""specdec export-config: the same speculative choice as llama.cpp, vLLM and SGLang flags.

Takes the spec flags `generate` takes (auto included) and prints the equivalent settings, so
a choice made on one machine carries to a distributed engine:

    specdec export-config -m qwen2.5-coder-1.5b --spec-type draft-simple -md qwen2.5-coder-0.5b

Where an engine has no equivalent (suffix decoding in llama.cpp, several drafters at once in
vLLM), the nearest setting is given and the line says so.
"""

from __future__ import annotations

import json
import shlex
import sys

from specdec.engine.config import MODEL_TYPES, TREE_TYPES, VLLM_METHODS, SpecConfig

# our spec type -> vLLM method (the inverse of engine/config.py VLLM_METHODS)
_VLLM = {ours: theirs for theirs, ours in VLLM_METHODS.items()}
# vLLM has one n-gram method; llama.cpp's hash-map variants are nearest to it
for _t in ("ngram-map-k", "ngram-map-k4v", "ngram-cache"):
    _VLLM[_t] = "ngram"
_SGLANG = {"draft-simple": "STANDALONE", "draft-eagle3": "EAGLE3", "draft-mtp": "NEXTN", "draft-dflash": "DFLASH",
           "ngram-simple": "NGRAM", "ngram-map-k": "NGRAM", "ngram-map-k4v": "NGRAM", "ngram-cache": "NGRAM",
           "suffix": "NGRAM"}
_NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 6}  # drafters/ngram.py NgramSimple n_min, n_max


def export(spec: SpecConfig, model: str = "MODEL") -> dict:
    """{"llama.cpp": {...}, "vllm": {...}, "sglang": {...}}: args (list), command (str), notes (list)."""
    return {"specdec": {"types": list(spec.types), "draft_n_max": spec.draft_n_max, "draft_n_min": spec.draft_n_min,
                        "draft_p_min": spec.draft_p_min, "draft_model": spec.draft_model, "adaptive": spec.adaptive,
                        "acceptance": spec.acceptance, "tree_topk": spec.tree_topk, "tree_budget": spec.tree_budget},
            "llama.cpp": _llama_cpp(spec, model), "vllm": _vllm(spec, model), "sglang": _sglang(spec, model)}


def _common_notes(spec: SpecConfig, engine: str) -> list[str]:
    notes = []
    if spec.adaptive:
        notes.append(f"{engine} has no adaptive draft length like --spec-adaptive; the fixed maximum is used")
    if spec.acceptance == "typical":
        notes.append(f"typical (lossy) acceptance is not carried over to {engine}: its output stays exact")
    if spec.cross_tokenizer:
        notes.append(f"{engine} cannot draft across tokenizers; the draft model must share the target's tokenizer")
    if spec.tree_topk > 1 and engine != "SGLang":
        notes.append(f"the token tree (--spec-tree-topk {spec.tree_topk}) is not carried over to {engine}: "
                     "it drafts a chain")
    return notes


def _llama_cpp(spec: SpecConfig, model: str) -> dict:
    args = ["llama-server", "-m", model]
    notes = _common_notes(spec, "llama.cpp")
    if spec.enabled:
        types = []
        for t in spec.types:
            if t == "suffix":
                notes.append("llama.cpp has no suffix decoding; nearest: ngram-simple")
                t = "ngram-simple"
            if t not in types:
                types.append(t)
        args += ["--spec-type", ",".join(types)]
        if spec.draft_model:
            args += ["-md", spec.draft_model]
        args += ["--spec-draft-n-max", str(spec.draft_n_max)]
        if spec.draft_n_min:
            args += ["--spec-draft-n-min", str(spec.draft_n_min)]
        if spec.draft_p_min:
            args += ["--spec-draft-p-min", str(spec.draft_p_min)]
    return {"args": args, "command": shlex.join(args), "notes": notes}


def _vllm(spec: SpecConfig, model: str) -> dict:
    args = ["vllm", "serve", model]
    notes = _common_notes(spec, "vLLM")
    if model.endswith(".gguf"):
        notes.append("vLLM's GGUF support is experimental: add --tokenizer <the original Hugging Face repo>")
    config = None
    if spec.enabled:
        chosen = _one_method(spec, notes, "vLLM runs one method")
        method = _VLLM[chosen]
        if method == "ngram" and chosen != "ngram-simple":
            notes.append(f"vLLM has no {chosen}; nearest: ngram (prompt lookup)")
        config = {"method": method, "num_speculative_tokens": spec.draft_n_max}
        if spec.draft_model and chosen in MODEL_TYPES and chosen != "draft-mtp":
            config["model"] = spec.draft_model
        if method == "ngram":
            config.update(_NGRAM_LOOKUP)
        if spec.draft_p_min and chosen in MODEL_TYPES:
            notes.append("vLLM has no draft probability floor (--spec-draft-p-min); dropped")
        args += ["--speculative-config", json.dumps(config)]
    return {"args": args, "command": shlex.join(args), "notes": notes, "speculative_config": config}


def _one_method(spec: SpecConfig, notes: list[str], what: str) -> str:
    """The one spec type an engine that runs a single method keeps (a model drafter first); notes the rest."""
    model_types = [t for t in spec.types if t in MODEL_TYPES]
    chosen = model_types[0] if model_types else spec.types[0]
    dropped = [t for t in spec.types if t != chosen]
    if dropped:
        notes.append(f"{what}; {', '.join(dropped)} dropped (kept {chosen})")
    return chosen


def _sglang(spec: SpecConfig, model: str) -> dict:
    args = ["python", "-m", "sglang.launch_server", "--model-path", model]
    notes = _common_notes(spec, "SGLang")
    if spec.enabled:
        chosen = _one_method(spec, notes, "SGLang runs one algorithm")
        algorithm = _SGLANG.get(chosen)
        if algorithm is None:
            notes.append(f"SGLang has no {chosen}; nearest: DFLASH")
            algorithm = "DFLASH"
        if algorithm == "NGRAM":
            if chosen != "ngram-simple":
                notes.append(f"SGLang has no {chosen}; nearest: NGRAM")
            notes.append("SGLang's NGRAM runs on CUDA only")
            args += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(spec.draft_n_max + 1)]
        else:
            args += ["--speculative-algorithm", algorithm]
            if spec.draft_model and chosen != "draft-mtp":
                args += ["--speculative-draft-model-path", spec.draft_model]
            # k steps of topk candidates each; the verified tokens: the tree (a chain when topk is 1) + the root
            tree = chosen in TREE_TYPES and spec.tree_topk > 1
            drafted = spec.effective_tree_budget if tree else spec.draft_n_max
            args += ["--speculative-num-steps", str(spec.draft_n_max),
                     "--speculative-eagle-topk", str(spec.tree_topk if tree else 1),
                     "--speculative-num-draft-tokens", str(drafted + 1)]
    return {"args": args, "command": shlex.join(args), "notes": notes}


def format_export(out: dict) -> str:
    s = out["specdec"]
    head = f"# specdec: {','.join(s['types']) or 'none'}, draft length {s['draft_n_max']}"
    if s["draft_model"]:
        head += f", draft model {s['draft_model']}"
    lines = [head]
    for engine, title in (("llama.cpp", "llama.cpp"), ("vllm", "vLLM"), ("sglang", "SGLang")):
        lines += ["", f"# {title}", out[engine]["command"]]
        lines += [f"#   note: {n}" for n in out[engine]["notes"]]
    return "\n".join(lines)


def spec_for_export(args) -> tuple[SpecConfig, list[str]]:
    """The SpecConfig `generate` would run with these flags; auto reads the model's files (no weights built)."""
    from specdec.cli import spec_from_args
    from specdec.engine.auto import auto_requested, choose_auto, tree_overrides

    if not auto_requested(args.spec_type, args.model_draft, args.speculative_config):
        return spec_from_args(args)
    from specdec.engine.auto import DrafterFacts, TargetFacts
    from specdec.inspect import describe_drafter, mtp_info
    from specdec.model.load import open_checkpoint
    from specdec.model.registry import resolve

    checkpoint, tokenizer = open_checkpoint(resolve(args.model))
    mtp = mtp_info(checkpoint)
    target = TargetFacts(args.model, mtp["declared"], mtp["weights_present"], args.weights)
    draft = None
    if args.model_draft:
        d = describe_drafter(resolve(args.model_draft), checkpoint, tokenizer, args.model, args.model_draft)
        draft = DrafterFacts(args.model_draft, d["kind"], d["compatible"], d["reason"] or "")
    n_max = args.spec_draft_n_max if args.spec_draft_n_max is not None else 3
    spec, reasons = choose_auto(target, draft, draft_n_max=n_max)
    spec = spec.with_overrides(draft_n_min=args.spec_draft_n_min or 0, draft_p_min=args.spec_draft_p_min or 0.0,
                               adaptive=bool(args.spec_adaptive),
                               acceptance="typical" if args.spec_typical else "exact", **tree_overrides(spec, args))
    return spec, [f"auto: {r}" for r in reasons]


def cmd_export(args) -> int:
    from specdec.model.registry import MODELS, resolve

    spec, notes = spec_for_export(args)
    for note in notes:
        print(note, file=sys.stderr)
    model = str(resolve(args.model)) if args.model in MODELS else args.model
    if spec.draft_model in MODELS:
        spec = spec.with_overrides(draft_model=str(resolve(spec.draft_model)))
    out = export(spec, model)
    print(json.dumps(out, indent=2) if args.json else format_export(out))
    return 0


def add_parser(sub) -> None:
    from specdec.cli import add_model_args, add_spec_args

    p = sub.add_parser("export-config", help="print llama.cpp, vLLM and SGLang flags for these speculative settings")
    add_model_args(p)
    add_spec_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_export)
