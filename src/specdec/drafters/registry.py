"""Every drafter kind, in one table (docs/design.md, "Drafters"): names are resolved here, once.

A kind is a llama.cpp --spec-type name. Its entry says how to build it from narrow
arguments, whether it is a model drafter (one at a time, tried after the model-free
kinds), whether it drafts token trees, and what vLLM and SGLang call it.

    >>> from specdec.drafters import registry
    >>> registry.create(DrafterSpec.of("ngram-map-k", min_hits=3), BuildContext(target=None)).name
    'ngram-map-k'
    >>> DrafterSpec.parse("ngram-map-k:min_hits=1000").options
    (('min_hits', 1000),)

Options of a model-free kind are its constructor's keyword arguments (NgramMapK(min_hits=...)).
Model drafters take theirs from the BuildContext: the speculative settings (-md, p-min, tree
shape) that the engine's SpecConfig holds.
"""

from __future__ import annotations

import inspect
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable

from specdec.drafters.base import DEFAULT_DRAFT_LENGTH, Drafter
from specdec.drafters.block.drafter import make_block_drafter
from specdec.drafters.draft_model import CrossTokenizerDrafter, DraftModelDrafter, check_compatible
from specdec.drafters.eagle3 import make_eagle3_drafter
from specdec.drafters.grammar import GrammarDrafter
from specdec.drafters.mtp import make_mtp_drafter
from specdec.drafters.ngram import NgramSimple
from specdec.drafters.ngram_cache import NgramCache
from specdec.drafters.ngram_map import NgramMapK, NgramMapK4V
from specdec.drafters.ngram_mod import NgramMod
from specdec.drafters.suffix import SuffixDrafter

__all__ = ["DEFAULT_DRAFT_LENGTH", "BuildContext", "DrafterSpec", "Entry", "create", "entry", "kinds", "register"]


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter to run: its kind (a registry name) and its options (constructor keywords),
    as sorted (name, value) pairs so that a spec is hashable and compares by value."""

    kind: str
    options: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(kind: str, **options: Any) -> "DrafterSpec":
        return DrafterSpec(kind, tuple(sorted(options.items())))

    @staticmethod
    def parse(text: str) -> "DrafterSpec":
        """'ngram-map-k:min_hits=1000' -> DrafterSpec('ngram-map-k', (('min_hits', 1000),)).

        The one reader of this syntax (bench --methods): values are ints, floats or strings."""
        kind, *opts = text.strip().split(":")
        options = {}
        for opt in opts:
            key, sep, value = opt.partition("=")
            if not sep or not key:
                raise ValueError(f"drafter option {opt!r} in {text!r} is not key=value")
            options[key] = value if _takes_text(kind, key) else _number(value)  # a path "007" stays "007"
        return DrafterSpec.of(kind, **options)

    def label(self) -> str:
        """The spec in the syntax `parse` reads."""
        return ":".join([self.kind] + [f"{k}={v}" for k, v in self.options])


@dataclass(frozen=True)
class BuildContext:
    """What a model drafter is built from. Model-free kinds need none of it.

    target: the loaded target Model; load_model(name_or_path) -> Model loads a draft model
    (the engine caches them); tree_budget 0 = tree_topk * draft length.
    """

    target: Any
    max_len: int = 4096
    draft_model: str | None = None
    p_min: float = 0.0
    cross_tokenizer: bool = False
    tree_topk: int = 1
    tree_budget: int = DEFAULT_DRAFT_LENGTH
    load_model: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class Entry:
    """A drafter kind.

    build(ctx, **options) -> Drafter, or None when this build of specdec cannot run the kind.
    vllm / sglang: the method names those engines give it (None: they have no such method).
    """

    kind: str
    build: Callable[..., Drafter] | None
    model: bool = False  # reads a model (draft model, MTP/EAGLE-3 head): one at a time, tried last
    trees: bool = False  # can draft token trees (--spec-tree-topk)
    vllm: str | None = None
    sglang: str | None = None
    summary: str = ""
    draft_model: bool = False  # drafts with a separate language model given with -md (--spec-cross-tokenizer applies)
    block: bool = False  # one drafter pass drafts a whole block (the folder's block size is its draft length)
    head: str | None = None  # a head trained on the target's hidden states: its folder name under heads/<model>/
    config_names: tuple[str, ...] = ()  # words in a head folder's config.json model_type / architectures
    auto: bool = False  # auto adds this model-free kind (it drafts only where the text repeats)
    own_layers: bool = False  # drafts with layers the target's checkpoint carries (no model path to give others)
    noun: str = ""  # what its folder holds, for people: "an EAGLE-3 head"
    llama_cpp: str | None = None  # llama.cpp's --spec-type name (None: llama.cpp has no such kind)
    llama_cpp_size_m: str | None = None  # llama.cpp's flag for this n-gram kind's draft length
    llama_cpp_options: tuple[tuple[str, str], ...] = ()  # (option, the llama.cpp flag that sets the same thing)
    first: bool = False  # tried before every other kind (the grammar's forced tokens: free, and the target's own)

    @property
    def runnable(self) -> bool:
        return self.build is not None


_entries: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    """Add a kind; a name names one kind only."""
    known = _entries.get(entry.kind)
    if known is not None and known != entry:
        raise ValueError(f"drafter kind {entry.kind!r} is already registered; pick another name")
    _entries[entry.kind] = entry
    return entry


def kinds() -> list[str]:
    """Every registered kind, runnable or not, sorted."""
    return sorted(_entries)


def entries() -> list[Entry]:
    return [_entries[k] for k in kinds()]


def entry(kind: str) -> Entry:
    """The entry of `kind`; a ValueError listing the valid names when there is none."""
    found = _entries.get(kind)
    if found is None:
        raise ValueError(f"unknown drafter kind {kind!r}; valid kinds are: none, {', '.join(kinds())}")
    return found


def model_free_kinds() -> list[str]:
    return [e.kind for e in entries() if not e.model]


def with_flag(flag: str) -> list[str]:
    """The kinds whose entry sets `flag` (an Entry field: model, trees, draft_model, block, head), sorted."""
    return [e.kind for e in entries() if getattr(e, flag)]


def kind_of_head(head: str) -> str:
    """The kind whose heads are stored as `head` (mtp, eagle3, dflash, dspark)."""
    return next(e.kind for e in entries() if e.head == head)


def head_kind_of(config_text: str) -> str | None:
    """The head kind whose config names appear in `config_text` (a config.json's model_type and architectures,
    lower case), in registration order, so that "eagle3" wins over "eagle"; None when none does."""
    for e in _entries.values():
        if any(name in config_text for name in e.config_names):
            return e.kind
    return None


def from_vllm(method: str) -> str:
    """Our kind for a vLLM --speculative-config method (ngram -> ngram-simple)."""
    for e in entries():
        if e.vllm == method and (method != "ngram" or e.kind == "ngram-simple"):
            return e.kind
    methods = sorted({e.vllm for e in entries() if e.vllm})
    raise ValueError(f"--speculative-config method {method!r} is not one of {', '.join(methods)}")


def create(spec: DrafterSpec, ctx: BuildContext) -> Drafter:
    """A new drafter for `spec`. Clear errors for unknown kinds, kinds this build cannot run,
    and options the kind does not take."""
    e = entry(spec.kind)
    if e.build is None:
        raise ValueError(f"--spec-type {spec.kind} is not available in this build of specdec yet")
    options = dict(spec.options)
    accepted = _keyword_args(e.build)
    unknown = sorted(set(options) - accepted) if accepted is not None else []
    if unknown:
        valid = ", ".join(sorted(accepted)) or "none"
        raise ValueError(f"drafter {spec.kind!r} takes no option {', '.join(map(repr, unknown))}; it takes: {valid}")
    types = getattr(e.build, "option_types", {})  # bench --methods reads values from text: "abc", 2.5, nan
    for name, value in options.items():
        if types.get(name) is int and type(value) is not int:
            raise ValueError(f"drafter {spec.kind!r} option {name} must be a whole number, got {value!r}")
        if types.get(name) is float and (type(value) not in (int, float) or not math.isfinite(value)):
            raise ValueError(f"drafter {spec.kind!r} option {name} must be a finite number, got {value!r}")
    return e.build(ctx, **options)


def check_options(spec: DrafterSpec) -> None:
    """Build a model-free kind once, so that a bad option is an error before any model loads (a model
    kind needs its target to be built: it is checked when the engine builds it)."""
    if not entry(spec.kind).model:
        create(spec, BuildContext(target=None))


def _keyword_args(build: Callable) -> set[str] | None:
    """Option names `build` takes after the context, or None when it takes **options."""
    params = list(inspect.signature(build).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _takes_text(kind: str, option: str) -> bool:
    """Whether a known kind's option is typed as text (a path), so that parse leaves it as written."""
    build = _entries[kind].build if kind in _entries else None
    hint = getattr(build, "option_types", {}).get(option)
    return str in (typing.get_args(hint) or (hint,))


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# -- the kinds -----------------------------------------------------------------------------------
def _model_free(cls) -> Callable[..., Drafter]:
    """build(ctx, **options) for a class whose constructor takes the options (their types: option_types)."""

    def build(ctx: BuildContext, **options) -> Drafter:
        drafter = cls(**options)
        if hasattr(drafter, "check_vocab") and ctx.target is not None:  # ids from a file (ngram-cache's corpus)
            drafter.check_vocab(ctx.target.config.vocab_size)
        return drafter

    build.option_types = typing.get_type_hints(cls)

    build.__signature__ = inspect.Signature(
        [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY)]
        + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(cls).parameters.values()])
    return build


def _draft_model(ctx: BuildContext) -> Drafter:
    if ctx.draft_model is None:
        raise ValueError("--spec-type draft-simple needs a draft model (-md/--model-draft)")
    draft = ctx.load_model(ctx.draft_model)
    if ctx.cross_tokenizer:
        return CrossTokenizerDrafter(draft, ctx.target.tokenizer, ctx.p_min, ctx.max_len)
    check_compatible(ctx.target, draft)
    return DraftModelDrafter(draft, ctx.target.config.vocab_size, ctx.p_min, ctx.max_len)


def _mtp(ctx: BuildContext) -> Drafter:
    return make_mtp_drafter(ctx.target, ctx.p_min, ctx.max_len, ctx.tree_topk, ctx.tree_budget, ctx.draft_model)


def _eagle3(ctx: BuildContext) -> Drafter:
    return make_eagle3_drafter(ctx.target, ctx.draft_model, ctx.p_min, ctx.max_len, ctx.tree_topk, ctx.tree_budget)


def _block(kind: str) -> Callable[..., Drafter]:
    """build(ctx) for a block drafter kind: the folder is -md/--model-draft (else one shipped for the target)."""

    def build(ctx: BuildContext) -> Drafter:
        return make_block_drafter(ctx.target, ctx.draft_model, kind, ctx.p_min, ctx.max_len)

    return build


for _entry in (
    Entry("ngram-simple", _model_free(NgramSimple), vllm="ngram", sglang="NGRAM",
          summary="copy what followed the last earlier occurrence of the context's tail",
          llama_cpp="ngram-simple", llama_cpp_size_m="--spec-ngram-simple-size-m"),
    Entry("ngram-map-k", _model_free(NgramMapK), vllm="ngram", sglang="NGRAM",
          summary="n-gram -> its stored occurrence; drafts as many as the key's last draft kept",
          llama_cpp="ngram-map-k", llama_cpp_size_m="--spec-ngram-map-k-size-m",
          llama_cpp_options=(("key_size", "--spec-ngram-map-k-size-n"), ("min_hits", "--spec-ngram-map-k-min-hits"))),
    Entry("ngram-map-k4v", _model_free(NgramMapK4V), vllm="ngram", sglang="NGRAM",
          summary="n-gram -> up to 4 counted continuations; drafts when one dominates",
          llama_cpp="ngram-map-k4v", llama_cpp_size_m="--spec-ngram-map-k4v-size-m",
          llama_cpp_options=(("key_size", "--spec-ngram-map-k4v-size-n"),
                             ("min_hits", "--spec-ngram-map-k4v-min-hits"))),
    Entry("ngram-mod", _model_free(NgramMod), vllm="ngram", sglang="NGRAM",
          summary="hashed n-gram -> next token table kept across requests; drafts a chain of lookups",
          llama_cpp="ngram-mod", llama_cpp_size_m="--spec-ngram-mod-n-max",
          llama_cpp_options=(("n_match", "--spec-ngram-mod-n-match"), ("n_min", "--spec-ngram-mod-n-min"))),
    Entry("ngram-cache", _model_free(NgramCache), vllm="ngram", sglang="NGRAM",
          summary="context, earlier outputs and a static corpus (llama.cpp's three tiers)", llama_cpp="ngram-cache"),
    Entry("suffix", _model_free(SuffixDrafter), vllm="suffix", sglang="NGRAM",
          summary="suffix trees over this request and earlier outputs", auto=True),
    Entry("grammar", _model_free(GrammarDrafter), first=True,
          summary="what the request's grammar forces next (JSON keys and punctuation, a tool call's skeleton)"),
    Entry("draft-simple", _draft_model, model=True, vllm="draft_model", sglang="STANDALONE",
          summary="a smaller model with the same tokenizer", draft_model=True, noun="a draft model",
          llama_cpp="draft-simple"),
    Entry("draft-mtp", _mtp, model=True, trees=True, vllm="mtp", sglang="NEXTN",
          summary="the model's own multi-token-prediction layers (or a trained MTP head; Gemma 4: its assistant)",
          head="mtp", config_names=("gemma4_assistant",), own_layers=True, noun="an MTP head", llama_cpp="draft-mtp"),
    Entry("draft-eagle3", _eagle3, model=True, trees=True, vllm="eagle3", sglang="EAGLE3",
          summary="an EAGLE-3 head on three of the target's hidden layers", head="eagle3",
          config_names=("eagle3", "eagle"), noun="an EAGLE-3 head", llama_cpp="draft-eagle3"),
    Entry("draft-dflash", _block("draft-dflash"), model=True, vllm="dflash", sglang="DFLASH",
          summary="a block drafter conditioned on the target's hidden states", block=True, head="dflash",
          config_names=("dflash",), noun="a DFlash drafter", llama_cpp="draft-dflash"),
    Entry("draft-dspark", _block("draft-dspark"), model=True, vllm="dspark", sglang="DSPARK",
          summary="DFlash plus a Markov correction and a confidence head", block=True, head="dspark",
          config_names=("dspark",), noun="a DSpark drafter", llama_cpp="draft-dspark"),
):
    register(_entry)
