"""What a server keeps between constrained requests (engine/constrain.py): the model's vocabulary for the
grammar engine, built once however many requests ask at once (or in a thread at start), and compiled grammars
by kind and text, a bounded LRU whose hits give the same masks and the same greedy answers as a fresh compile."""

from __future__ import annotations

import json
import threading
import time

import pytest

from specdec.engine import constrain
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams
from specdec.sampling.grammar import GrammarState, compile_grammar

SCHEMA_A = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "blue"]}},
            "required": ["ok", "tag"], "additionalProperties": False}
SCHEMA_B = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["n"], "additionalProperties": False}


@pytest.fixture
def fresh_model(tiny_hf_dir):
    """The tiny model with its own tokenizer, so its vocabulary and grammar cache start empty."""
    from specdec.model.load import load_model

    return load_model(str(tiny_hf_dir), "fp32", progress=False)


def test_the_vocabulary_is_built_once_however_many_ask(fresh_model, monkeypatch):
    built = []
    real = constrain.GrammarVocabulary

    def slow_build(*args):  # a slow build, so that the askers below overlap it
        built.append(1)
        time.sleep(0.2)
        return real(*args)

    monkeypatch.setattr(constrain, "GrammarVocabulary", slow_build)
    got = []
    askers = [threading.Thread(target=lambda: got.append(constrain.grammar_vocabulary(fresh_model)))
              for _ in range(3)]
    warm = constrain.warm_vocabulary(fresh_model)
    for t in askers:
        t.start()
    for t in askers + [warm]:
        t.join()
    assert len(built) == 1 and len(got) == 3 and all(v is got[0] for v in got)
    assert constrain.grammar_vocabulary(fresh_model) is got[0]


def test_a_cached_grammar_gives_the_same_masks_and_answers(fresh_model):
    text_a, text_b = json.dumps(SCHEMA_A), json.dumps(SCHEMA_B)
    missed = constrain.compile_for(fresh_model, "json_schema", text_a)
    other = constrain.compile_for(fresh_model, "json_schema", text_b)
    hit = constrain.compile_for(fresh_model, "json_schema", text_a)
    assert hit is missed and other is not missed
    assert constrain.compile_for(fresh_model, "gbnf", 'root ::= "x"') is not constrain.compile_for(
        fresh_model, "gbnf", 'root ::= "y"')
    uncached = compile_grammar("json_schema", text_a, constrain.grammar_vocabulary(fresh_model))
    engine = Engine(fresh_model, SpecConfig(drafters=("ngram-simple",)), max_len=128)
    prompt = fresh_model.tokenizer.encode("hello")
    answers = {}
    for name, grammar in (("hit", hit), ("uncached", uncached), ("other", other)):
        for spec in (SpecConfig(), SpecConfig(drafters=("ngram-simple",))):  # plain, speculative
            answers[name, spec.enabled] = engine.generate(prompt, SamplingParams(grammar=grammar), 40,
                                                          spec=spec).token_ids
    assert answers["hit", True] == answers["hit", False] == answers["uncached", False] == answers["uncached", True]
    assert set(json.loads(fresh_model.tokenizer.decode(answers["hit", False]))) == {"ok", "tag"}
    assert answers["other", False] != answers["hit", False]
    states = [GrammarState(g) for g in (hit, uncached)]  # the masks along the answer, one by one
    for token in answers["hit", False]:
        assert bool((states[0].mask() == states[1].mask()).all())
        for s in states:
            s.advance([token])


def test_the_cache_is_bounded_and_the_least_recently_used_goes(fresh_model):
    texts = [f'root ::= "g{i}"' for i in range(constrain.GRAMMAR_CACHE + 6)]
    first = constrain.compile_for(fresh_model, "gbnf", texts[0])
    for text in texts[1:constrain.GRAMMAR_CACHE]:
        constrain.compile_for(fresh_model, "gbnf", text)
    assert constrain.compile_for(fresh_model, "gbnf", texts[0]) is first  # used again: the newest now
    for text in texts[constrain.GRAMMAR_CACHE:]:
        constrain.compile_for(fresh_model, "gbnf", text)
    cache = constrain.grammar_vocabulary(fresh_model).grammars
    assert len(cache) == constrain.GRAMMAR_CACHE
    assert ("gbnf", texts[0]) in cache and ("gbnf", texts[1]) not in cache and ("gbnf", texts[6]) not in cache
    assert ("gbnf", texts[7]) in cache and ("gbnf", texts[-1]) in cache
    for _ in range(2):  # a grammar that fails is not kept: each request gets its error
        with pytest.raises(ValueError, match="does not parse"):
            constrain.compile_for(fresh_model, "gbnf", "root ::= (")
    assert len(cache) == constrain.GRAMMAR_CACHE and ("gbnf", "root ::= (") not in cache
