"""The drafter registry, and the contract every model-free drafter in it keeps."""

import random
import re

import pytest

from specdec.drafters import registry
from specdec.drafters.base import Draft
from specdec.drafters.grammar import GrammarDrafter
from specdec.drafters.ngram import NgramSimple
from specdec.drafters.ngram_cache import NgramCache
from specdec.drafters.ngram_map import NgramMapK, NgramMapK4V
from specdec.drafters.ngram_mod import NgramMod
from specdec.drafters.registry import BuildContext, DrafterSpec, Entry
from specdec.drafters.suffix import SuffixDrafter

MODEL_FREE = {
    "ngram-simple": NgramSimple,
    "ngram-map-k": NgramMapK,
    "ngram-map-k4v": NgramMapK4V,
    "ngram-mod": NgramMod,
    "ngram-cache": NgramCache,
    "suffix": SuffixDrafter,
}
NO_TARGET = BuildContext(target=None)


def create(kind, **options):
    return registry.create(DrafterSpec.of(kind, **options), NO_TARGET)


# --- the registry ---


def test_every_drafter_kind_is_registered_under_its_llama_cpp_name():
    # the grammar drafter drafts what a request's grammar forces (tests/lossless/test_grammar_matrix.py)
    assert set(registry.kinds()) == set(MODEL_FREE) | {"grammar", "draft-simple", "draft-mtp", "draft-eagle3",
                                                       "draft-dflash", "draft-dspark"}
    assert registry.kinds() == sorted(registry.kinds())
    assert registry.model_free_kinds() == sorted([*MODEL_FREE, "grammar"])
    for name, cls in {**MODEL_FREE, "grammar": GrammarDrafter}.items():
        drafter = create(name)
        assert type(drafter) is cls and drafter.name == name and drafter.hidden_layers == ()
    assert {e.kind for e in registry.entries() if e.trees} == {"draft-mtp", "draft-eagle3"}
    # every model kind runs in this build; DFlash / DSpark draft one block (a chain), their folder from -md
    assert {e.kind for e in registry.entries() if e.model and e.runnable} == {"draft-simple", "draft-mtp",
                                                                             "draft-eagle3", "draft-dflash",
                                                                             "draft-dspark"}


def test_options_reach_the_constructor():
    assert create("ngram-simple", order_min=3, order_max=5).order_min == 3
    assert create("suffix", max_tree_depth=8).max_tree_depth == 8


def test_unknown_kind_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown drafter kind 'ngram'; valid kinds are: none, draft-.*suffix"):
        create("ngram")


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(ValueError, match="'ngram-simple' takes no option 'size'; it takes: order_max, order_min"):
        create("ngram-simple", size=3)
    with pytest.raises(ValueError, match="'draft-mtp' takes no option 'topk'; it takes: none"):
        create("draft-mtp", topk=2)
    with pytest.raises(ValueError, match="'draft-dflash' takes no option 'block_size'; it takes: none"):
        create("draft-dflash", block_size=8)


@pytest.mark.parametrize("method, message", [
    ("ngram-map-k:min_hits=abc", "'ngram-map-k' option min_hits must be a whole number, got 'abc'"),  # TypeError
    ("ngram-map-k:key_size=2.5", "'ngram-map-k' option key_size must be a whole number, got 2.5"),  # after baseline
    ("ngram-map-k:min_hits=nan", "'ngram-map-k' option min_hits must be a whole number, got nan"),  # never drafted
    ("suffix:max_tree_depth=1e9", "'suffix' option max_tree_depth must be a whole number, got 1000000000.0"),
    ("suffix:min_token_prob=nan", "'suffix' option min_token_prob must be a finite number, got nan"),
    ("ngram-map-k:min_hits=0", "ngram-map-k: min_hits must be at least 1"),
    # a TypeError's traceback: static_corpus takes token-id lists from Python, not text
    ("ngram-cache:static_corpus=5", "ngram-cache: static_corpus must be a list of token-id lists (got 5); to read"),
    ("ngram-cache:static_corpus=abc", "ngram-cache: static_corpus must be a list of token-id lists (got abc)"),
    # each token was indexed under every order: 12 GB and a minute over 2000 tokens
    ("ngram-simple:order_max=100000000", "ngram-simple: order_max must be at most 64 tokens (got 100000000)"),
    ("ngram-map-k4v:key_size=65", "ngram-map-k4v: key_size must be at most 64 tokens"),
    ("ngram-cache:ngram_max=99", "ngram-cache: ngram_max must be at most 64 tokens"),
    ("suffix:max_tree_depth=100000", "suffix: max_tree_depth must be from 2 to 128"),
])
def test_bench_methods_options_are_checked_when_parsed(method, message):
    """bench --methods values come from text: each was a traceback (often after the baseline had run) or a
    drafter that silently never drafted; now parse_methods builds the model-free drafters once."""
    from specdec.bench.methods import parse_methods

    with pytest.raises(ValueError, match=re.escape(message)):
        parse_methods(method)
    assert parse_methods("suffix:min_token_prob=1:max_tree_depth=16")[1].spec.drafters[0].options == (
        ("max_tree_depth", 16), ("min_token_prob", 1))


def test_a_kind_this_build_cannot_run_says_so(monkeypatch):
    monkeypatch.setitem(registry._entries, "draft-future", Entry("draft-future", None, model=True))
    assert not registry.entry("draft-future").runnable
    with pytest.raises(ValueError, match="--spec-type draft-future is not available in this build"):
        create("draft-future")


def test_spec_labels_parse_back():
    spec = DrafterSpec.parse("ngram-map-k:min_hits=1000:key_size=4")
    assert spec == DrafterSpec.of("ngram-map-k", key_size=4, min_hits=1000)
    assert DrafterSpec.parse(spec.label()) == spec and spec.label() == "ngram-map-k:key_size=4:min_hits=1000"
    assert DrafterSpec.parse("suffix:min_token_prob=0.2").options == (("min_token_prob", 0.2),)
    with pytest.raises(ValueError, match="'min_hits' in 'ngram-map-k:min_hits' is not key=value"):
        DrafterSpec.parse("ngram-map-k:min_hits")


def test_vllm_methods_map_to_kinds():
    assert registry.from_vllm("ngram") == "ngram-simple" and registry.from_vllm("draft_model") == "draft-simple"
    assert registry.from_vllm("mtp") == "draft-mtp" and registry.from_vllm("eagle3") == "draft-eagle3"
    with pytest.raises(ValueError, match="method 'medusa' is not one of"):
        registry.from_vllm("medusa")


def test_register_refuses_a_taken_name():
    entry = Entry("test-kind", lambda ctx: NgramSimple())
    registry.register(entry)
    try:
        assert "test-kind" in registry.kinds() and isinstance(create("test-kind"), NgramSimple)
        registry.register(entry)  # the same entry again: fine
        with pytest.raises(ValueError, match="already registered"):
            registry.register(Entry("test-kind", lambda ctx: NgramMapK()))
        with pytest.raises(ValueError, match="already registered"):
            registry.register(Entry("suffix", lambda ctx: NgramSimple()))
    finally:
        registry._entries.pop("test-kind", None)


# --- the drafter contract, for every model-free kind ---

KINDS = sorted(MODEL_FREE)
# kinds whose drafts depend on the calls before, as llama.cpp's do: the n-gram map counts the calls that found a
# key and cuts a key's drafts to what its last one kept; ngram-mod indexes new text in chunks of 32 tokens
# and empties its table after poor drafts (test_ngram_reference.py replays llama.cpp's own calls for them)
HISTORY_DEPENDENT = {"ngram-map-k", "ngram-map-k4v", "ngram-mod"}


def periodic(length, period=5):
    return [10 + i % period for i in range(length)]


@pytest.mark.parametrize("name", KINDS)
def test_no_draft_on_fresh_random_context(name):
    rng = random.Random(0)
    context = rng.sample(range(100_000), 400)  # no token repeats: nothing to copy
    d = create(name)
    d.begin(context[:100])
    for end in range(100, 401, 10):
        result = d.propose(context[:end], 8)
        assert isinstance(result, Draft) and result.tokens == () and len(result) == 0


@pytest.mark.parametrize("name", KINDS)
def test_max_tokens_is_respected(name):
    context = periodic(60)

    def drafter():
        d = create(name)
        d.begin(context)
        return d

    # the same context asked again with a longer draft: the n-gram map would look for an occurrence that
    # more tokens follow than the one its first call stored (llama.cpp's m never changes): ask a new drafter
    d = drafter()
    lengths = [len((drafter() if name in HISTORY_DEPENDENT else d).propose(context, k).tokens)
               for k in (0, 1, 2, 5, 16)]
    assert lengths[0] == 0
    assert all(n <= k for n, k in zip(lengths, (0, 1, 2, 5, 16)))
    assert lengths[1:4] == [1, 2, 5]  # a periodic text is drafted in full by every kind
    expected = [10 + i % 5 for i in range(60, 76)]
    assert list(drafter().propose(context, 16).tokens) == expected[: lengths[4]]


@pytest.mark.parametrize("name", KINDS)
def test_begin_resets_the_request(name):
    d = create(name)
    d.begin(periodic(30))
    assert len(d.propose(periodic(30), 4)) == 4
    prompt = [99] + periodic(4)  # the same 4 tokens, never followed in this request
    d.begin(prompt)
    assert d.propose(prompt, 4).tokens == ()


def phrases(rng, length=200):
    """Recurring phrases (some sharing a prefix) with a little noise: every kind drafts
    at some steps and declines at others."""
    choices = [[1, 2, 3, 4], [1, 2, 5], [6, 7, 8, 9, 10], [3, 4, 6]]
    text = []
    while len(text) < length:
        text += rng.choice(choices) if rng.random() < 0.85 else [rng.randrange(20, 60)]
    return text


@pytest.mark.parametrize("name", sorted(set(KINDS) - HISTORY_DEPENDENT))
def test_incremental_drafts_equal_drafts_from_scratch(name):
    # Context grows by 1-4 tokens between calls (accepted drafts + the bonus token); the
    # drafter's incremental index must give the same drafts as one built from scratch.
    rng = random.Random(name)
    text = phrases(rng)
    d = create(name)
    d.begin(text[:20])
    end, drafted, declined = 20, 0, 0
    while end < len(text):
        fresh = create(name)
        fresh.begin(text[:end])
        tokens = d.propose(text[:end], 6).tokens
        assert tokens == fresh.propose(text[:end], 6).tokens, end
        drafted, declined = drafted + bool(tokens), declined + (not tokens)
        d.on_accept(rng.randrange(4))
        end += rng.randint(1, 4)
    assert drafted >= 10 and declined >= 2  # the comparison covered both cases


@pytest.mark.parametrize("name", KINDS)
def test_a_context_that_does_not_continue_starts_over(name):
    d = create(name)
    d.begin(periodic(30))
    other = [50, 51, 52, 53, 50, 51, 52]  # begin() was skipped: no draft from periodic(30)
    fresh = create(name)
    fresh.begin(other)
    assert d.propose(other, 4).tokens == fresh.propose(other, 4).tokens
    shorter = other[:5]  # a context shorter than what was seen is no continuation either
    fresh = create(name)
    fresh.begin(shorter)
    assert d.propose(shorter, 4).tokens == fresh.propose(shorter, 4).tokens


def test_a_path_option_that_reads_as_a_number_stays_a_path(tmp_path, monkeypatch):
    """bench --methods "ngram-cache:static_path=2024" parsed 2024 as a number: a TypeError traceback."""
    from specdec.drafters.registry import BuildContext, DrafterSpec, create

    monkeypatch.chdir(tmp_path)
    for name in ("2024", "007", "1e3"):  # "007" had opened 7, "1e3" 1000.0
        (tmp_path / name).write_text("1 2 3 1 2 3 4")
        drafter = create(DrafterSpec.parse(f"ngram-cache:static_path={name}"), BuildContext(target=None))
        assert drafter.static_path == name
    assert DrafterSpec.parse("ngram-map-k:min_hits=007").options == (("min_hits", 7),)  # numbers stay numbers
