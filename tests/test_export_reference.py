"""specdec export-config read back by a parser of our own, written from what each engine documents and
sharing no code with specdec's option parsing or its drafter registry:

- llama.cpp (`llama-server --help`, common/arg.cpp): the flag names below, `--spec-type` a comma list of
  its speculative types, flags it has removed (`--draft-max`, `--draft-min`, ...) refused;
- vLLM (`vllm serve MODEL`): `--speculative-config` a JSON object of SpeculativeConfig's fields (method
  one of its SpeculativeMethod names, num_speculative_tokens > 0, prompt_lookup_min/max >= 1, required
  for ngram, a `model` for the methods that run one);
- SGLang (`python -m sglang.launch_server`): `--speculative-algorithm` one of its algorithms; for the
  EAGLE family, with topk 1 the verified tokens are steps + 1 (SGLang overwrites any other value), and
  with topk > 1 at most 1 + topk + (steps - 1) * topk^2 (the candidates its tree picks from).

Each command is split as a shell splits it (shlex), so quoting is checked too.
"""

from __future__ import annotations

import json
import shlex

import pytest

from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.cli.export import export


class Refused(ValueError):
    """The engine would refuse (or silently rewrite) this command line."""


def parse_flags(argv: list[str], flags: dict[str, tuple[str, type]], removed: frozenset = frozenset()) -> dict:
    """argv (after the program and its positionals) -> {canonical name: [values]}; flags: every spelling ->
    (canonical name, value type). Each flag here takes one value, as the ones specdec prints all do."""
    out: dict[str, list] = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in removed:
            raise Refused(f"{flag} has been removed")
        if flag not in flags:
            raise Refused(f"unknown argument {flag!r}")
        if i + 1 >= len(argv):
            raise Refused(f"{flag} expects a value")
        name, kind = flags[flag]
        try:
            value = kind(argv[i + 1])
        except (TypeError, ValueError) as exc:
            raise Refused(f"{flag} {argv[i + 1]!r}: {exc}") from None
        out.setdefault(name, []).append(value)
        i += 2
    return out


def one(parsed: dict, name: str, default=None):
    values = parsed.get(name, [default])
    return values[-1]


# -- llama.cpp --------------------------------------------------------------------------------------------
LLAMA_TYPES = {"none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
               "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"}


def _count(low: int, high: int):
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value
    return parse


def _spec_types(text: str) -> tuple[str, ...]:
    types = tuple(text.split(","))
    unknown = [t for t in types if t not in LLAMA_TYPES]
    if unknown:
        raise ValueError(f"unknown speculative types {unknown}")
    return types


LLAMA_FLAGS = {
    **dict.fromkeys(("-m", "--model"), ("model", str)), **dict.fromkeys(("-c", "--ctx-size"), ("ctx", int)),
    "--spec-type": ("types", _spec_types),
    **dict.fromkeys(("--spec-draft-model", "-md", "--model-draft"), ("draft_model", str)),
    "--spec-draft-n-max": ("n_max", int), "--spec-draft-n-min": ("n_min", int),
    **dict.fromkeys(("--spec-draft-p-min", "--draft-p-min"), ("p_min", float)),
    **{f"--spec-ngram-{kind}-size-{nm}": (f"{kind}_size_{nm}", _count(1, 1024))
       for kind in ("simple", "map-k", "map-k4v") for nm in "nm"},
    "--spec-ngram-mod-n-min": ("mod_n_min", _count(0, 1024)), "--spec-ngram-mod-n-max": ("mod_n_max", _count(0, 1024)),
    "--spec-ngram-mod-n-match": ("mod_n_match", _count(1, 1024)),
}
LLAMA_REMOVED = frozenset({"--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min", "--spec-ngram-size-n",
                           "--spec-ngram-size-m", "--spec-ngram-min-hits"})
# the draft length of each type: its own m-gram length for the map / simple n-grams, else --spec-draft-n-max
LLAMA_LENGTH = {"ngram-simple": "simple_size_m", "ngram-map-k": "map-k_size_m", "ngram-map-k4v": "map-k4v_size_m",
                "ngram-mod": "mod_n_max"}


def parse_llama_cpp(command: str) -> dict:
    argv = shlex.split(command)
    if argv[:1] != ["llama-server"]:
        raise Refused(f"not llama-server: {argv[:1]}")
    parsed = parse_flags(argv[1:], LLAMA_FLAGS, LLAMA_REMOVED)
    if "model" not in parsed:
        raise Refused("no model (-m)")
    types = tuple(t for values in parsed.get("types", []) for t in values)  # --spec-type appends
    needs_model = [t for t in types if t in ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")]
    if needs_model and "draft_model" not in parsed:
        raise Refused(f"{needs_model} need a draft model (-md)")
    return {**{k: v[-1] for k, v in parsed.items()}, "types": types}


# -- vLLM ---------------------------------------------------------------------------------------------------
VLLM_METHODS = {"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
                "extract_hidden_states", "mtp", "deepseek_mtp", "dflash", "ngram_gpu", "dspark"}
VLLM_WITH_MODEL = {"draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "dflash", "dspark"}
VLLM_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
             "draft_tensor_parallel_size", "quantization", "max_model_len", "revision", "code_revision",
             "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
             "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob", "draft_sample_method",
             "rejection_sample_method", "parallel_drafting", "enforce_eager", "kv_cache_dtype"}


def _speculative_config(text: str) -> dict:
    config = json.loads(text)
    if not isinstance(config, dict):
        raise ValueError("not a JSON object")
    unknown = sorted(set(config) - VLLM_KEYS)
    if unknown:
        raise ValueError(f"SpeculativeConfig has no fields {unknown}")
    method = config.get("method")
    if method not in VLLM_METHODS:
        raise ValueError(f"method {method!r} is not one of vLLM's")
    n = config.get("num_speculative_tokens")
    if not (isinstance(n, int) and not isinstance(n, bool) and n > 0):
        raise ValueError(f"num_speculative_tokens must be an integer > 0, got {n!r}")
    lookup = {k: config[k] for k in ("prompt_lookup_min", "prompt_lookup_max") if k in config}
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in lookup.values()):
        raise ValueError(f"prompt_lookup_min/max must be integers >= 1, got {lookup}")
    if method == "ngram" and "prompt_lookup_max" not in config:
        raise ValueError("method ngram requires prompt_lookup_max")
    if len(lookup) == 2 and lookup["prompt_lookup_min"] > lookup["prompt_lookup_max"]:
        raise ValueError(f"prompt_lookup_min above prompt_lookup_max: {lookup}")
    if method in VLLM_WITH_MODEL and not config.get("model"):
        raise ValueError(f"method {method} needs a model")
    return config


VLLM_FLAGS = {"--max-model-len": ("ctx", int), "--speculative-config": ("speculative", _speculative_config)}


def parse_vllm(command: str) -> dict:
    argv = shlex.split(command)
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3 or argv[2].startswith("-"):
        raise Refused(f"not `vllm serve MODEL`: {argv[:3]}")
    return {"model": argv[2], **{k: v[-1] for k, v in parse_flags(argv[3:], VLLM_FLAGS).items()}}


# -- SGLang -------------------------------------------------------------------------------------------------
SGLANG_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"}
SGLANG_EAGLE_FAMILY = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"}


def _algorithm(text: str) -> str:
    if text not in SGLANG_ALGORITHMS:
        raise ValueError(f"invalid choice {text!r}")
    return text


SGLANG_FLAGS = {
    **dict.fromkeys(("--model-path", "--model"), ("model", str)), "--context-length": ("ctx", int),
    "--speculative-algorithm": ("algorithm", _algorithm),
    **dict.fromkeys(("--speculative-draft-model-path", "--speculative-draft-model"), ("draft_model", str)),
    "--speculative-num-steps": ("steps", int), "--speculative-eagle-topk": ("topk", int),
    "--speculative-num-draft-tokens": ("draft_tokens", int),
}


def parse_sglang(command: str) -> dict:
    argv = shlex.split(command)
    if argv[:3] != ["python", "-m", "sglang.launch_server"]:
        raise Refused(f"not sglang.launch_server: {argv[:3]}")
    parsed = {k: v[-1] for k, v in parse_flags(argv[3:], SGLANG_FLAGS).items()}
    if "model" not in parsed:
        raise Refused("no --model-path")
    algorithm = parsed.get("algorithm")
    if algorithm in SGLANG_EAGLE_FAMILY and "steps" in parsed:
        steps, topk, tokens = parsed["steps"], parsed.get("topk", 1), parsed.get("draft_tokens")
        if steps < 1 or topk < 1:
            raise Refused(f"steps {steps}, topk {topk}: each at least 1")
        if topk == 1 and tokens != steps + 1:
            raise Refused(f"topk 1: num_draft_tokens {tokens} is rewritten to steps + 1 = {steps + 1}")
        most = 1 + topk + (steps - 1) * topk * topk
        if topk > 1 and not 2 <= tokens <= most:
            raise Refused(f"num_draft_tokens {tokens} out of 2..{most}: {steps} steps of topk {topk} offer "
                          f"{most - 1} candidates to pick {tokens - 1} from")
    if algorithm in ("STANDALONE", "EAGLE", "EAGLE3", "DFLASH", "DSPARK") and "draft_model" not in parsed:
        raise Refused(f"{algorithm} needs --speculative-draft-model-path")
    return parsed


# -- what each specdec kind means there (our own tables, not specdec's registry) ------------------------------
VLLM_METHOD = {"ngram-simple": "ngram", "ngram-map-k": "ngram", "ngram-map-k4v": "ngram", "ngram-mod": "ngram",
               "ngram-cache": "ngram", "suffix": "suffix", "draft-simple": "draft_model", "draft-mtp": "mtp",
               "draft-eagle3": "eagle3", "draft-dflash": "dflash", "draft-dspark": "dspark"}
SGLANG_ALGORITHM = {"ngram-simple": "NGRAM", "ngram-map-k": "NGRAM", "ngram-map-k4v": "NGRAM", "ngram-mod": "NGRAM",
                    "ngram-cache": "NGRAM", "suffix": "NGRAM", "draft-simple": "STANDALONE", "draft-mtp": "NEXTN",
                    "draft-eagle3": "EAGLE3", "draft-dflash": "DFLASH", "draft-dspark": "DSPARK"}
LLAMA_TYPE = {**{k: k for k in VLLM_METHOD}, "suffix": "ngram-simple"}  # llama.cpp has no suffix decoding
DRAFT = "/models/my drafts/d'raft"  # a space and a quote: the commands must quote it


def _spec(kind: str, **settings) -> SpecConfig:
    model = DRAFT if kind.startswith("draft-") and kind != "draft-mtp" else None
    return SpecConfig(drafters=(kind,), draft_model=model, **settings)


@pytest.mark.parametrize("kind", sorted(VLLM_METHOD))
def test_each_kind_exports_commands_each_engine_accepts_with_its_meaning(kind):
    spec = _spec(kind, draft_n_max=5)
    out = export(spec, "/models/target model.gguf", ctx_size=4096)
    for engine in ("llama.cpp", "vllm", "sglang"):
        assert shlex.split(out[engine]["command"]) == out[engine]["args"], engine

    llama = parse_llama_cpp(out["llama.cpp"]["command"])
    assert (llama["model"], llama["ctx"], llama["types"]) == ("/models/target model.gguf", 4096, (LLAMA_TYPE[kind],))
    assert llama.get("draft_model") == spec.draft_model
    assert llama[LLAMA_LENGTH.get(LLAMA_TYPE[kind], "n_max")] == 5

    vllm = parse_vllm(out["vllm"]["command"])
    assert (vllm["model"], vllm["ctx"]) == ("/models/target model.gguf", 4096)
    config = vllm["speculative"]
    assert (config["method"], config["num_speculative_tokens"], config.get("model")) == \
        (VLLM_METHOD[kind], 5, spec.draft_model)

    sglang = parse_sglang(out["sglang"]["command"])
    assert (sglang["model"], sglang["ctx"], sglang["algorithm"]) == \
        ("/models/target model.gguf", 4096, SGLANG_ALGORITHM[kind])
    assert sglang.get("draft_model") == spec.draft_model
    # the tokens verified a step: the last token and its drafts (a chain of 5 here)
    assert sglang["draft_tokens"] == 6
    if sglang["algorithm"] in SGLANG_EAGLE_FAMILY:
        assert (sglang["steps"], sglang["topk"]) == (5, 1)


@pytest.mark.parametrize("kind", ["draft-eagle3", "draft-mtp"])
@pytest.mark.parametrize("n, topk, budget", [(3, 2, 0), (3, 2, 5), (4, 3, 0), (2, 4, 8), (1, 2, 2)])
def test_a_tree_goes_to_sglang_as_a_tree_it_can_fill(kind, n, topk, budget):
    sglang = parse_sglang(export(_spec(kind, draft_n_max=n, tree_topk=topk, tree_budget=budget), "t")["sglang"]
                          ["command"])
    assert (sglang["steps"], sglang["topk"], sglang["draft_tokens"]) == (n, topk, (budget or topk * n) + 1)


@pytest.mark.parametrize("n, topk, budget", [(2, 2, 10), (1, 2, 5), (1, 4, 8), (3, 2, 64)])
def test_a_tree_budget_beyond_what_sglang_drafts_is_not_exported_as_is(n, topk, budget):
    """SGLang drafts topk + (steps - 1) * topk^2 candidates and picks num_draft_tokens - 1 of them with
    torch.topk, which fails when asked for more: the export gives it the most the tree holds, with a note."""
    spec = _spec("draft-eagle3", draft_n_max=n, tree_topk=topk, tree_budget=budget)
    out = export(spec, "t")["sglang"]
    sglang = parse_sglang(out["command"])
    assert sglang["draft_tokens"] == topk + (n - 1) * topk * topk + 1
    assert any("holds at most" in note for note in out["notes"])


def test_the_draft_settings_llama_cpp_and_vllm_have_flags_for():
    spec = SpecConfig(drafters=("draft-simple",), draft_model=DRAFT, draft_n_max=6, draft_n_min=2, draft_p_min=0.25)
    llama = parse_llama_cpp(export(spec, "t.gguf")["llama.cpp"]["command"])
    assert (llama["n_max"], llama["n_min"], llama["p_min"]) == (6, 2, 0.25)
    sized = SpecConfig(drafters=(DrafterSpec.of("ngram-simple", order_min=2, order_max=5),), draft_n_max=7)
    config = parse_vllm(export(sized, "t")["vllm"]["command"])["speculative"]
    assert (config["prompt_lookup_min"], config["prompt_lookup_max"], config["num_speculative_tokens"]) == (2, 5, 7)
    both = SpecConfig(drafters=("ngram-map-k", "draft-simple"), draft_model=DRAFT, draft_n_max=4)
    llama = parse_llama_cpp(export(both, "t.gguf")["llama.cpp"]["command"])
    assert llama["types"] == ("ngram-map-k", "draft-simple") and llama["map-k_size_m"] == llama["n_max"] == 4
    assert parse_vllm(export(both, "t")["vllm"]["command"])["speculative"]["method"] == "draft_model"


def test_no_speculation_is_a_plain_command_everywhere():
    out = export(SpecConfig(), "t.gguf")
    assert parse_llama_cpp(out["llama.cpp"]["command"]) == {"model": "t.gguf", "types": ()}
    assert parse_vllm(out["vllm"]["command"]) == {"model": "t.gguf"}
    assert parse_sglang(out["sglang"]["command"]) == {"model": "t.gguf"}


@pytest.mark.parametrize("engine, command, why", [
    ("llama.cpp", "llama-server -m t.gguf --draft-max 4", "removed"),
    ("llama.cpp", "llama-server -m t.gguf --spec-type eagle3", "unknown speculative types"),
    ("llama.cpp", "llama-server -m t.gguf --spec-type draft-simple", "need a draft model"),
    ("llama.cpp", "llama-server -m t.gguf --spec-ngram-simple-size-m 0", "between 1 and 1024"),
    ("llama.cpp", "llama-server -m t.gguf --spec-draft-nmax 4", "unknown argument"),
    ("vllm", """vllm serve t --speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'""",
     "requires prompt_lookup_max"),
    ("vllm", """vllm serve t --speculative-config '{"method": "eagle-3", "num_speculative_tokens": 3}'""",
     "not one of vLLM's"),
    ("vllm", """vllm serve t --speculative-config '{"method": "eagle3", "num_speculative_tokens": 3}'""",
     "needs a model"),
    ("vllm", """vllm serve t --speculative-config '{"method": "mtp", "num_speculative_tokens": 0}'""", "> 0"),
    ("vllm", """vllm serve t --speculative-config '{"method": "mtp", "num_draft_tokens": 3}'""", "has no fields"),
    ("vllm", "vllm serve t --speculative-config {method: mtp}", "Expecting property name"),
    ("sglang", "python -m sglang.launch_server --model-path t --speculative-algorithm EAGLE3 "
               "--speculative-draft-model-path d --speculative-num-steps 3 --speculative-eagle-topk 1 "
               "--speculative-num-draft-tokens 3", "rewritten to steps \\+ 1"),
    ("sglang", "python -m sglang.launch_server --model-path t --speculative-algorithm NEXTN "
               "--speculative-num-steps 2 --speculative-eagle-topk 2 --speculative-num-draft-tokens 8", "out of 2..7"),
    ("sglang", "python -m sglang.launch_server --model-path t --speculative-algorithm MEDUSA", "invalid choice"),
    ("sglang", "python -m sglang.launch_server --model-path t --speculative-algorithm STANDALONE "
               "--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3",
     "needs --speculative-draft-model-path"),
])
def test_the_parsers_refuse_what_the_engines_refuse(engine, command, why):
    """The parsers can fail: each of these lines is one the engine refuses (or rewrites)."""
    parse = {"llama.cpp": parse_llama_cpp, "vllm": parse_vllm, "sglang": parse_sglang}[engine]
    with pytest.raises(Refused, match=why):
        parse(command)
