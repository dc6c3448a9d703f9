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
from pathlib import Path

from specdec.cli.options import add_model_args, add_spec_args, spec_request
from specdec.drafters import registry
from specdec.drafters.describe import block_facts
from specdec.drafters.mtp import shipped_head_for
from specdec.drafters.ngram import NgramSimple
from specdec.drafters.tree import most_nodes
from specdec.engine.config import SpecConfig
from specdec.engine.setup import check_ctx_size, check_explicit
from specdec.engine.spec_request import AutoTarget, build_spec
from specdec.model.errors import SpecdecError
from specdec.model.checkpoint_facts import assistant_beside, is_assistant_folder, mtp_info, sidecar_path
from specdec.model.load import open_checkpoint, weights_format_for
from specdec.model import catalogue

NGRAM = registry.from_vllm("ngram")  # the n-gram kind every engine has (prompt lookup): the nearest to the others


def export(spec: SpecConfig, model: str = "MODEL", ctx_size: int | None = None, specdec_mtp: str | None = None) -> dict:
    """{"llama.cpp": {...}, "vllm": {...}, "sglang": {...}}: args (list), command (str), notes (list).

    ctx_size: the context length to carry over (0: the model's own; None: leave each engine's default).
    specdec_mtp: where draft-mtp's head comes from when it is specdec's own (trained, beside the model,
    shipped) rather than MTP layers in the checkpoint, which is all the other engines read.
    """
    out = {"specdec": {"types": list(spec.types), "drafters": [d.label() for d in spec.drafters],
                       "draft_n_max": spec.draft_n_max, "draft_n_min": spec.draft_n_min,
                       "draft_p_min": spec.draft_p_min, "draft_model": spec.draft_model, "adaptive": spec.adaptive,
                       "acceptance": spec.acceptance, "tree_topk": spec.tree_topk, "tree_budget": spec.tree_budget,
                       "ctx_size": ctx_size},
           "llama.cpp": _llama_cpp(spec, _start("llama.cpp", model, ctx_size), model),
           "vllm": _vllm(spec, _start("vllm", model, ctx_size), model),
           "sglang": _sglang(spec, _start("sglang", model, ctx_size))}
    if specdec_mtp and spec.model_kind and registry.entry(spec.model_kind).own_layers:
        for engine in ("llama.cpp", "vllm", "sglang"):
            out[engine]["notes"].append(f"the MTP head is specdec's own ({specdec_mtp}); this engine reads MTP "
                                        "layers only from the model's checkpoint, so this command cannot run it")
    return out


def _start(engine: str, model: str, ctx_size: int | None) -> list[str]:
    """The command up to the speculative flags: the program, the model and its context length."""
    args, flag = {"llama.cpp": (["llama-server", "-m", model], "-c"),
                  "vllm": (["vllm", "serve", model], "--max-model-len"),
                  "sglang": (["python", "-m", "sglang.launch_server", "--model-path", model], "--context-length")}[engine]
    if ctx_size is not None and (ctx_size > 0 or engine == "llama.cpp"):  # 0: the model's own; llama.cpp says -c 0
        args += [flag, str(ctx_size)]
    return args


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
    if engine != "llama.cpp":  # llama.cpp has both flags
        if spec.draft_n_min:
            notes.append(f"{engine} has no minimum draft length (--spec-draft-n-min {spec.draft_n_min}); dropped")
        if spec.draft_p_min and engine == "SGLang":  # vLLM's line says so where it keeps a model drafter
            notes.append(f"SGLang has no draft probability floor (--spec-draft-p-min {spec.draft_p_min}); dropped")
    sizes = next((d.options for d in spec.drafters if d.kind == NGRAM and d.options), None)
    if sizes and engine != "vLLM":  # vLLM takes them as prompt_lookup_min/max
        notes.append(f"the n-gram sizes of {NGRAM} ({', '.join(f'{k}={v}' for k, v in sizes)}) are not "
                     f"carried over to {engine}; it uses its own" + (" (--spec-ngram-simple-size-n: one size)"
                                                                     if engine == "llama.cpp" else ""))
    return notes


def _llama_cpp(spec: SpecConfig, args: list[str], model: str) -> dict:
    notes = _common_notes(spec, "llama.cpp")
    for what, path in (("model", model), ("draft", spec.draft_model)):
        if path and not path.endswith(".gguf") and Path(path).is_dir():
            notes.append(f"llama.cpp loads GGUF files only: convert the {what} folder {path} first "
                         "(llama.cpp's convert_hf_to_gguf.py)")
    if spec.enabled:
        types = []
        for t in spec.types:
            name = registry.entry(t).llama_cpp
            if name is None:
                name = registry.entry(NGRAM).llama_cpp
                notes.append(f"llama.cpp has no {t} ({registry.entry(t).summary}); nearest: {name}")
            if name not in types:
                types.append(name)
        args += ["--spec-type", ",".join(types)]
        if spec.draft_model:
            args += ["-md", spec.draft_model]
        # llama.cpp's n-gram kinds draft up to their own m-gram length; --spec-draft-n-max sets the others'
        size_m = {e.llama_cpp: e.llama_cpp_size_m for e in registry.entries()}
        for t in types:
            if size_m[t]:
                args += [size_m[t], str(spec.draft_n_max)]
        for d in spec.drafters:  # options llama.cpp has flags for; the others are said in a note
            flags = dict(registry.entry(d.kind).llama_cpp_options)
            for option, value in d.options:
                if option in flags:
                    args += [flags[option], str(value)]
                elif d.kind != NGRAM:  # ngram-simple's sizes have their own note (_common_notes)
                    notes.append(f"{d.kind}'s {option}={value} has no llama.cpp flag; llama.cpp uses its own")
        if any(not size_m[t] for t in types):
            args += ["--spec-draft-n-max", str(spec.draft_n_max)]
        if spec.draft_n_min:
            args += ["--spec-draft-n-min", str(spec.draft_n_min)]
        if spec.draft_p_min:
            args += ["--spec-draft-p-min", str(spec.draft_p_min)]
    return {"args": args, "command": shlex.join(args), "notes": notes}


def _vllm(spec: SpecConfig, args: list[str], model: str) -> dict:
    notes = _common_notes(spec, "vLLM")
    if model.endswith(".gguf"):
        notes.append("vLLM's GGUF support is experimental: add --tokenizer <the original Hugging Face repo>")
    config = None
    if spec.enabled:
        chosen = _one_method(spec, notes, "vLLM runs one method")
        method = registry.entry(chosen).vllm
        if method == "ngram" and chosen != NGRAM:
            notes.append(f"vLLM has no {chosen}; nearest: ngram (prompt lookup)")
        config = {"method": method, "num_speculative_tokens": spec.draft_n_max}
        if spec.draft_model and registry.entry(chosen).model and not registry.entry(chosen).own_layers:
            config["model"] = spec.draft_model
        if method == "ngram":
            config.update(_prompt_lookup(spec))
        if spec.draft_p_min and registry.entry(chosen).model:
            notes.append("vLLM has no draft probability floor (--spec-draft-p-min); dropped")
        notes += _block_notes(spec, chosen)
        args += ["--speculative-config", json.dumps(config)]
    return {"args": args, "command": shlex.join(args), "notes": notes, "speculative_config": config}


def _prompt_lookup(spec: SpecConfig) -> dict:
    """vLLM's n-gram sizes: the n-gram kind's orders (its options, else its defaults)."""
    options = {"order_min": NgramSimple.order_min, "order_max": NgramSimple.order_max}
    for d in spec.drafters:
        if d.kind == NGRAM:
            options.update(d.options)
    return {"prompt_lookup_min": options["order_min"], "prompt_lookup_max": options["order_max"]}


def _one_method(spec: SpecConfig, notes: list[str], what: str) -> str:
    """The one spec type an engine that runs a single method keeps (a model drafter first); notes the rest."""
    chosen = spec.model_kind or spec.types[0]
    dropped = [t for t in spec.types if t != chosen]
    if dropped:
        notes.append(f"{what}; {', '.join(dropped)} dropped (kept {chosen})")
    return chosen


def _block_notes(spec: SpecConfig, chosen: str) -> list[str]:
    """A DFlash / DSpark folder's block drafts a fixed number of tokens; say so when the draft length differs."""
    folder = Path(spec.draft_model or "")
    if not registry.entry(chosen).block or not (folder / "config.json").is_file():
        return []
    try:
        facts = block_facts(json.loads((folder / "config.json").read_text()))
    except (OSError, json.JSONDecodeError):
        return []
    if facts is None or facts["drafts_per_block"] == spec.draft_n_max:
        return []
    n = facts["drafts_per_block"]
    return [f"the drafter's block of {facts['block_size']} drafts {n} tokens a step; the draft length "
            f"{spec.draft_n_max} {'uses only part of it' if spec.draft_n_max < n else 'is cut to it'} "
            f"(--spec-draft-n-max {n} for the whole block)"]


def _sglang(spec: SpecConfig, args: list[str]) -> dict:
    notes = _common_notes(spec, "SGLang")
    if spec.enabled:
        chosen = _one_method(spec, notes, "SGLang runs one algorithm")
        algorithm = registry.entry(chosen).sglang
        if algorithm is None:  # a kind registered without an SGLang name (registry.register)
            notes.append(f"SGLang has no {chosen}: this command runs without speculation")
        elif algorithm == "NGRAM":
            if chosen != NGRAM:
                notes.append(f"SGLang has no {chosen}; nearest: NGRAM")
            notes.append("SGLang's NGRAM runs on CUDA only")
            args += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(spec.draft_n_max + 1)]
        elif registry.entry(chosen).block:
            # one block a step: the verified tokens are the block (the last token + its drafts)
            args += ["--speculative-algorithm", algorithm]
            if spec.draft_model:
                args += ["--speculative-draft-model-path", spec.draft_model]
            args += ["--speculative-num-draft-tokens", str(spec.draft_n_max + 1)]
            notes += _block_notes(spec, chosen)
        else:
            args += ["--speculative-algorithm", algorithm]
            if spec.draft_model and not registry.entry(chosen).own_layers:
                args += ["--speculative-draft-model-path", spec.draft_model]
            # k steps of topk candidates each; the verified tokens: the tree (a chain when topk is 1) + the root
            tree = registry.entry(chosen).trees and spec.tree_topk > 1
            drafted = spec.effective_tree_budget if tree else spec.draft_n_max
            if tree and drafted > most_nodes(spec.tree_topk, spec.draft_n_max):
                drafted = most_nodes(spec.tree_topk, spec.draft_n_max)
                notes.append(f"a tree of topk {spec.tree_topk} and depth {spec.draft_n_max} holds at most {drafted} "
                             f"nodes (SGLang refuses more, specdec leaves the rest of --spec-tree-budget unused)")
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
    request = spec_request(args)
    explicit = check_explicit(request)  # what generate refuses is refused here too
    if explicit is not None:
        return explicit
    try:  # auto reads the model's files; printing flags never downloads them
        path = catalogue.resolve(args.model, auto_pull=False)
    except SpecdecError as exc:
        raise SpecdecError(f"{exc} (auto reads the model's files to choose), or name a --spec-type") from None
    checkpoint, tokenizer = open_checkpoint(path)
    return build_spec(request, AutoTarget(checkpoint, tokenizer, path, args.model, weights_format_for(path, args.weights)))


def specdec_mtp_source(spec: SpecConfig, model: str) -> str | None:
    """Where draft-mtp's head comes from when it is not MTP layers in the checkpoint (None when they are,
    or when draft-mtp is not used)."""
    if spec.model_kind is None or not registry.entry(spec.model_kind).own_layers:
        return None
    if spec.draft_model:  # a Gemma 4 assistant is no head of specdec's: llama.cpp runs it with -md too
        return None if is_assistant_folder(spec.draft_model) else f"a trained head, {spec.draft_model}"
    path = catalogue.resolve(model, auto_pull=False)
    checkpoint = open_checkpoint(path)[0]
    if mtp_info(checkpoint)["weights_present"]:
        return None
    side = sidecar_path(path)
    if side.is_dir():
        return f"a head beside the model, {side}"
    # where specdec generate finds a head (drafters/mtp.mtp_source), without building the model
    shipped = shipped_head_for(registry.entry(spec.model_kind).head, model, path, checkpoint)
    if shipped is not None:
        return f"a head shipped with specdec, {shipped}"
    raise ValueError(f"{model} has no MTP layers, no MTP head beside it and none shipped with specdec, so draft-mtp "
                     "has nothing to draft with (specdec generate refuses it too); train a head with `specdec train "
                     "mtp`, or use another --spec-type")


def shipped_drafter(spec: SpecConfig, model: str) -> tuple[SpecConfig, list[str]]:
    """Without -md, draft-eagle3 / -dflash / -dspark run the head shipped with specdec for the model (as generate
    does): the exported commands name its folder as the draft model (an EAGLE-3 head is in the layout vLLM and
    SGLang load). A model with none is refused, as generate refuses it; the commands had no draft model."""
    entry = registry.entry(spec.model_kind) if spec.model_kind else None
    if spec.draft_model or entry is None or entry.head is None or entry.own_layers:
        return spec, []
    what = entry.noun
    path = catalogue.resolve(model, auto_pull=False)
    head = shipped_head_for(entry.head, model, path, open_checkpoint(path)[0])
    if head is None:
        raise ValueError(f"--spec-type {spec.model_kind} needs {what} for {model} and specdec ships none for it "
                         "(specdec generate refuses it too): pass its folder with -md")
    return spec.with_overrides(draft_model=str(head)), [f"note: {spec.model_kind} runs {what} shipped with specdec, "
                                                        f"{head}: the commands below name it as the draft model"]


def gemma4_assistant(spec: SpecConfig, model: str) -> tuple[SpecConfig, list[str]]:
    """draft-mtp for a Gemma 4 target runs its assistant checkpoint: the one beside the model when -md names none
    (the commands name it as the draft model, as llama.cpp's draft-mtp loads it)."""
    if spec.model_kind is None or not registry.entry(spec.model_kind).own_layers:
        return spec, []
    path = catalogue.resolve(model, auto_pull=False)
    found = spec.draft_model or (assistant_beside(path) if getattr(open_checkpoint(path)[0].config, "gemma4", None)
                                 else None)
    if found is None or not is_assistant_folder(found):
        return spec, []
    notes = [f"note: draft-mtp runs the Gemma 4 assistant {found} (vLLM and SGLang: whether they run a "
             "gemma4_assistant as their MTP drafter is not checked here)"]
    return spec.with_overrides(draft_model=str(found)), notes


def cmd_export(args) -> int:
    check_ctx_size(args.ctx_size)
    spec, notes = spec_for_export(args)
    spec, shipped = shipped_drafter(spec, args.model)
    notes += shipped
    spec, helper = gemma4_assistant(spec, args.model)
    notes += helper
    for flag, value, what in (("--device", args.device, "where the target runs"),
                              ("--weights", args.weights, "specdec's in-memory weight format"),
                              ("--cache-type", args.cache_type, "specdec's KV cache format")):
        if value is not None:
            notes.append(f"note: {flag} {value} ({what}) is not carried over; each engine keeps its own setting")
    for note in notes:
        print(note, file=sys.stderr)
    mtp = specdec_mtp_source(spec, args.model)  # reads the checkpoint only for draft-mtp
    # a registry name becomes the path it is pulled to; printing flags does not download it
    model = str(catalogue.model_path(args.model)) if args.model in catalogue.MODELS else args.model
    if spec.draft_model in catalogue.MODELS:
        spec = spec.with_overrides(draft_model=str(catalogue.model_path(spec.draft_model)))
    for name in (args.model, spec.draft_model):
        if name in catalogue.MODELS and not catalogue.model_path(name).is_file():
            print(f"note: {name} is not pulled yet; `specdec pull {name}` puts it at {catalogue.model_path(name)}",
                  file=sys.stderr)
    out = export(spec, model, args.ctx_size, mtp)
    print(json.dumps(out, indent=2) if args.json else format_export(out))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("export-config", help="print llama.cpp, vLLM and SGLang flags for these speculative settings")
    add_model_args(p)
    add_spec_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_export, ctx_size=None)  # --ctx-size is carried over only when given
