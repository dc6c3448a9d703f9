"""The drafter registry, and the contract every model-free drafter in it keeps."""

import random

import pytest

from specdec.drafters import registry
from specdec.drafters.base import Draft
from specdec.drafters.ngram import NgramCache, NgramMapK, NgramMapK4V, NgramSimple
from specdec.drafters.suffix import SuffixDrafter

MODEL_FREE = {
    "ngram-simple": NgramSimple,
    "ngram-map-k": NgramMapK,
    "ngram-map-k4v": NgramMapK4V,
    "ngram-cache": NgramCache,
    "suffix": SuffixDrafter,
}


# --- the registry ---


def test_model_free_drafters_are_registered_under_llama_cpp_names():
    assert set(MODEL_FREE) <= set(registry.names())
    assert registry.names() == sorted(registry.names())
    for name, cls in MODEL_FREE.items():
        drafter = registry.create(name)
        assert type(drafter) is cls and drafter.name == name


def test_create_passes_keyword_arguments():
    assert registry.create("ngram-simple", n_min=3, n_max=5).n_min == 3
    assert registry.create("suffix", max_tree_depth=8).max_tree_depth == 8


def test_unknown_name_lists_the_valid_ones():
    valid = "ngram-cache, ngram-map-k, .*suffix"
    with pytest.raises(ValueError, match=f"unknown drafter 'ngram'; valid names are: {valid}"):
        registry.create("ngram")


def test_unknown_argument_names_the_valid_ones():
    message = "'ngram-simple' takes no argument 'size'; it takes: n_max, n_min"
    with pytest.raises(ValueError, match=message):
        registry.create("ngram-simple", size=3)


def test_register_any_callable_and_refuse_a_taken_name():
    calls = []

    def factory(**kwargs):  # **kwargs: the registry passes everything through
        calls.append(kwargs)
        return NgramSimple()

    registry.register("test-any-callable")(factory)
    try:
        assert "test-any-callable" in registry.names()
        assert isinstance(registry.create("test-any-callable", model="m.gguf"), NgramSimple)
        assert calls == [{"model": "m.gguf"}]
        registry.register("test-any-callable")(factory)  # same factory again: fine
        with pytest.raises(ValueError, match="already registered"):
            registry.register("test-any-callable")(NgramMapK)
        with pytest.raises(ValueError, match="already registered"):
            registry.register("suffix")(NgramSimple)
    finally:
        registry._factories.pop("test-any-callable", None)


# --- the drafter contract, for every model-free kind ---

KINDS = sorted(MODEL_FREE)


def periodic(length, period=5):
    return [10 + i % period for i in range(length)]


@pytest.mark.parametrize("name", KINDS)
def test_no_draft_on_fresh_random_context(name):
    rng = random.Random(0)
    context = rng.sample(range(100_000), 400)  # no token repeats: nothing to copy
    d = registry.create(name)
    d.begin(context[:100])
    for end in range(100, 401, 10):
        result = d.propose(context[:end], 8)
        assert isinstance(result, Draft) and result.tokens == () and len(result) == 0
        assert result.source == name


@pytest.mark.parametrize("name", KINDS)
def test_max_tokens_is_respected(name):
    context = periodic(60)
    d = registry.create(name)
    d.begin(context)
    lengths = [len(d.propose(context, k).tokens) for k in (0, 1, 2, 5, 16)]
    assert lengths[0] == 0
    assert all(n <= k for n, k in zip(lengths, (0, 1, 2, 5, 16)))
    assert lengths[1:4] == [1, 2, 5]  # a periodic text is drafted in full by every kind
    expected = [10 + i % 5 for i in range(60, 76)]
    assert list(d.propose(context, 16).tokens) == expected[: lengths[4]]


@pytest.mark.parametrize("name", KINDS)
def test_begin_resets_the_request(name):
    d = registry.create(name)
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


@pytest.mark.parametrize("name", KINDS)
def test_incremental_drafts_equal_drafts_from_scratch(name):
    # Context grows by 1-4 tokens between calls (accepted drafts + the bonus token); the
    # drafter's incremental index must give the same drafts as one built from scratch.
    rng = random.Random(name)
    text = phrases(rng)
    d = registry.create(name)
    d.begin(text[:20])
    end, drafted, declined = 20, 0, 0
    while end < len(text):
        fresh = registry.create(name)
        fresh.begin(text[:end])
        tokens = d.propose(text[:end], 6).tokens
        assert tokens == fresh.propose(text[:end], 6).tokens, end
        drafted, declined = drafted + bool(tokens), declined + (not tokens)
        d.on_accept(rng.randrange(4))
        end += rng.randint(1, 4)
    assert drafted >= 10 and declined >= 2  # the comparison covered both cases


@pytest.mark.parametrize("name", KINDS)
def test_a_context_that_does_not_continue_starts_over(name):
    d = registry.create(name)
    d.begin(periodic(30))
    other = [50, 51, 52, 53, 50, 51, 52]  # begin() was skipped: no draft from periodic(30)
    fresh = registry.create(name)
    fresh.begin(other)
    assert d.propose(other, 4).tokens == fresh.propose(other, 4).tokens
    shorter = other[:5]  # a context shorter than what was seen is no continuation either
    fresh = registry.create(name)
    fresh.begin(shorter)
    assert d.propose(shorter, 4).tokens == fresh.propose(shorter, 4).tokens
