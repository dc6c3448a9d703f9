"""ngram-simple and ngram-cache on hand-made token sequences: exact drafts, thresholds, files (ngram-map-k,
-k4v and ngram-mod: test_ngram_map.py, test_ngram_mod.py, test_ngram_reference.py)."""

import json

import numpy as np
import pytest

from specdec.drafters.ngram import NgramSimple
from specdec.drafters.ngram_cache import NgramCache, load_corpus, save_corpus
from specdec.drafters.ngram_map import NgramMapK, NgramMapK4V


def draft(drafter, context, max_tokens=8, prompt=None):
    """begin(prompt or context) then one propose; returns the drafted tokens."""
    drafter.begin(context if prompt is None else prompt)
    result = drafter.propose(context, max_tokens)
    assert result.tree.is_chain and result.draft_probs is None
    assert len(result.tokens) <= max_tokens
    return result.tokens


# --- ngram-simple ---


def test_simple_copies_what_followed_the_earlier_occurrence():
    assert draft(NgramSimple(), [1, 2, 3, 4, 9, 1, 2, 3], max_tokens=3) == (4, 9, 1)
    # Past the end of the context the copy continues with the same period.
    assert draft(NgramSimple(), [1, 2, 3, 4, 9, 1, 2, 3], max_tokens=7) == (4, 9, 1, 2, 3, 4, 9)


def test_simple_prefers_the_longest_match_then_the_most_recent():
    # (1, 2) occurred last before 6, but (7, 1, 2) pins the place before 5.
    assert draft(NgramSimple(), [7, 1, 2, 5, 8, 1, 2, 6, 7, 1, 2], max_tokens=3) == (5, 8, 1)
    assert draft(NgramSimple(), [1, 2, 5, 1, 2, 6, 1, 2], max_tokens=3) == (6, 1, 2)


def test_simple_needs_an_earlier_occurrence_of_at_least_order_min_tokens():
    assert draft(NgramSimple(), [1, 2, 3]) == ()  # the tail alone is no earlier occurrence
    assert draft(NgramSimple(), [1, 5, 1]) == ()  # only a 1-gram repeats
    assert draft(NgramSimple(order_min=1), [1, 5, 1], max_tokens=3) == (5, 1, 5)
    assert draft(NgramSimple(order_min=3, order_max=3), [7, 1, 2, 5, 8, 1, 2]) == ()


def test_simple_rejects_impossible_settings():
    with pytest.raises(ValueError, match="order_max"):
        NgramSimple(order_min=4, order_max=3)
    with pytest.raises(ValueError, match="order_min"):
        NgramSimple(order_min=0)


# --- ngram-cache ---


def test_cache_context_tier_drafts_token_by_token():
    assert draft(NgramCache(), [5, 6, 7, 5, 6, 7, 5, 6], max_tokens=4) == (7, 5, 6, 7)


def test_cache_context_thresholds():
    # 1-grams need 2 samples and 66 %: "1" -> 2 then 3 is a split, "1" -> 2, 2 is not.
    assert draft(NgramCache(), [1, 2, 1, 3, 1]) == ()
    assert draft(NgramCache(), [1, 2, 1, 2, 1], max_tokens=1) == (2,)
    assert draft(NgramCache(ngram_min=2, ngram_max=2), [1, 2, 1, 2, 1]) == ()  # 2-grams need 2


def test_cache_prefers_the_longest_ngram():
    context = [5, 1, 2, 6, 1, 2, 7, 1, 2, 9, 8, 1, 3, 4, 9, 8, 1]  # "1" -> 2 3 of 4 times
    assert draft(NgramCache(), context, max_tokens=1) == (3,)  # but (9, 8, 1) -> 3
    assert draft(NgramCache(ngram_max=1), context, max_tokens=1) == (2,)


def test_cache_dynamic_tier_learns_from_earlier_outputs_with_strict_thresholds():
    d = NgramCache()
    output = [40, 41, 42, 43, 44]
    prompt = [99, 40, 41]
    for seen in range(3):
        assert draft(d, prompt) == ()  # a 2-gram needs 3 earlier sightings here
        d.end(output)
    assert draft(d, prompt) == (42, 43, 44)
    assert draft(NgramCache(), prompt) == ()  # the dynamic tier is per drafter, not global


def test_cache_static_counts_break_ties_in_the_context_tier():
    context = [7, 8, 9, 10, 7, 8, 9, 20, 7, 8, 9]  # (7, 8, 9) -> 10 or 20
    assert draft(NgramCache(), context, max_tokens=1) == (10,)
    assert draft(NgramCache(static_corpus=[[8, 9, 20]]), context, max_tokens=1) == (20,)


@pytest.mark.parametrize("suffix", [".json", ".npy", ".txt"])
def test_cache_static_file_round_trip(tmp_path, suffix):
    docs = [[10, 11, 12, 13]] * 3  # each 2-gram followed 3 times: enough for the strict tier
    path = tmp_path / f"corpus{suffix}"
    if suffix == ".json":
        save_corpus(path, docs)
    elif suffix == ".npy":
        np.save(path, np.array(sum(docs, []), dtype=np.int32))
    else:
        path.write_text("\n".join(" ".join(map(str, doc)) for doc in docs))
    assert sum(load_corpus(path), []) == sum(docs, [])
    # n-grams do not span documents (13 -> 10 is not learned from the .json/.txt documents).
    assert draft(NgramCache.from_file(path), [7, 10, 11]) == (12, 13)
    assert draft(NgramCache(), [7, 10, 11]) == ()


def test_cache_static_file_needs_enough_samples(tmp_path):
    path = tmp_path / "corpus.json"
    save_corpus(path, [[10, 11, 12, 13]] * 2)
    assert draft(NgramCache.from_file(path), [7, 10, 11]) == ()


@pytest.mark.parametrize(
    "name, content",
    [
        ("words.json", '[1, 2, "x"]'),
        ("negative.json", "[1, -2, 3]"),
        ("object.json", '{"ids": [1, 2]}'),
        ("broken.json", "[1, 2"),
        ("empty.json", "[]"),
        ("words.txt", "1 2 three"),
        ("blank.txt", "\n\n"),
        ("garbage.npy", "not a numpy file"),
    ],
)
def test_cache_bad_static_file_is_one_clear_error(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=f"ngram-cache corpus {path}"):
        NgramCache.from_file(path)


def test_cache_bad_npy_dtype_and_missing_file(tmp_path):
    path = tmp_path / "floats.npy"
    np.save(path, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="float64"):
        load_corpus(path)
    with pytest.raises(FileNotFoundError, match="nothere.json does not exist"):
        NgramCache.from_file(tmp_path / "nothere.json")
    with pytest.raises(FileNotFoundError, match=f"corpus {tmp_path} is a folder"):  # it said "does not exist"
        NgramCache.from_file(tmp_path)
    with pytest.raises(ValueError, match="not both"):
        NgramCache(static_path=tmp_path / "x.json", static_corpus=[[1, 2]])


def test_save_corpus_writes_plain_json(tmp_path):
    save_corpus(tmp_path / "c.json", [np.array([1, 2]), (3,)])
    assert json.loads((tmp_path / "c.json").read_text()) == [[1, 2], [3]]


@pytest.mark.parametrize("cls", [NgramSimple, NgramMapK, NgramMapK4V, NgramCache])
def test_each_token_is_indexed_once(cls, monkeypatch):
    indexed = []
    original = cls._append
    monkeypatch.setattr(cls, "_append", lambda self, i: (indexed.append(i), original(self, i)))
    context = [1, 2, 3, 4] * 25
    d = cls()
    d.begin(context[:50])
    for end in range(51, 101):
        d.propose(context[:end], 4)
    assert indexed == list(range(100))


def test_a_corpus_id_past_the_targets_vocabulary_is_refused_when_built(tiny_model, tmp_path):
    """A corpus made with another tokenizer drafted ids the target has no row for: IndexError in its
    embedding mid-request. The drafter is refused when the request builds it, naming the file."""
    from specdec.drafters.registry import DrafterSpec
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    path = tmp_path / "corpus.json"
    save_corpus(path, [[5, 6, 9999] * 5])
    spec = SpecConfig(drafters=(DrafterSpec.of("ngram-cache", static_path=str(path)),))
    with pytest.raises(ValueError, match=r"corpus .*corpus.json holds token id 9999, outside the target's "
                                         r"vocabulary of 512"):
        Engine(tiny_model, max_len=64).generate([5, 6, 5, 6], SamplingParams(), 8, spec=spec)
    save_corpus(path, [[5, 6, 9] * 5])
    assert Engine(tiny_model, max_len=64).generate([5, 6, 5, 6], SamplingParams(), 8, spec=spec).token_ids
