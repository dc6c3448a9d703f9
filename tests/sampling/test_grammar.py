"""Grammars (sampling/grammar.py) and the bytes of tokens (model/token_bytes.py), on the tiny byte-level
vocabulary: masks worked out by hand, a draft walked and rolled back, forced tokens, and the errors a bad
schema or grammar gets."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers

from specdec.model.spm import spm_backend
from specdec.model.token_bytes import token_bytes
from specdec.model.tokenizer import Tokenizer
from specdec.sampling.grammar import GrammarState, GrammarVocabulary, compile_grammar

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def vocab(tiny_model):
    tok = tiny_model.tokenizer
    return GrammarVocabulary(token_bytes(tok, tiny_model.config.vocab_size), tok.eos_ids,
                             lambda text: tok.encode(text, add_bos=False))


def ids(tiny_model, text: str) -> list[int]:
    return tiny_model.tokenizer.encode(text, add_bos=False)


def allowed(mask: torch.Tensor) -> set[int]:
    return set(mask.nonzero().flatten().tolist())


def test_token_bytes_of_a_byte_level_vocabulary(tiny_model):
    tok = tiny_model.tokenizer
    vocab = token_bytes(tok, tok.vocab_size + 3)  # a model may have more rows than its tokenizer has ids
    for text in ("a", "{", " ", " the", "he"):  # one token each (merges: " t" + "he", "h" + "e")
        (token,) = ids(tiny_model, text)
        assert vocab.tokens[token] == text.encode(), text
    assert b"".join(vocab.tokens[t] for t in ids(tiny_model, 'é {"x": 1}')) == 'é {"x": 1}'.encode()
    specials = {tok.backend.token_to_id(s) for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert specials | set(range(tok.vocab_size, tok.vocab_size + 3)) == set(vocab.special)
    assert vocab.tokens[tok.vocab_size:] == (b"",) * 3


def test_token_bytes_of_a_sentencepiece_vocabulary():
    pieces = ["<unk>", "<s>", "</s>", "\u2581a", "b", "<0x41>", "<0xC3>", "\u2581\u2581"]
    types = [2, 3, 3, 1, 1, 6, 6, 1]
    tok = Tokenizer(spm_backend(pieces, [0.0] * len(pieces), types, True, 0), 1, [2], True, None, "gguf")
    vocab = token_bytes(tok, len(pieces))
    assert vocab.tokens[3:] == (b" a", b"b", b"A", b"\xc3", b"  ")
    assert set(vocab.special) == {0, 1, 2}


def test_a_vocabulary_without_known_bytes_is_refused():
    backend = Backend(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = Tokenizer(backend, None, [0], False, None, "tokenizer.json")
    with pytest.raises(ValueError, match="constrained decoding reads byte-level BPE and SentencePiece vocabularies"):
        token_bytes(tok, 3)


@pytest.mark.parametrize("kind, text, message", [
    ("regexp", "a+", r"grammar kind 'regexp' is not one of json_schema, json_object, gbnf"),
    ("json_schema", "{not json", "the JSON schema is not valid JSON"),
    ("json_schema", "[1, 2]", "the JSON schema must be a JSON object, got list"),
    ("json_schema", '{"type": "objekt"}', "the JSON schema cannot be used: Invalid type: objekt"),
    ("json_schema", '{"type": "string", "minLength": 5, "maxLength": 2}',
     r"the JSON schema cannot be used: Unsatisfiable schema: minLength \(5\) is greater than maxLength \(2\)"),
    ("json_schema", '{"properties": {"a": {"$ref": "#/$defs/b"}}}', "the JSON schema cannot be used: .*does not exist"),
    ("gbnf", "", "the grammar is empty"),
    ("gbnf", "root ::= [a-z", "the grammar does not parse: Unexpected end of input"),
    ("gbnf", "root ::= item", "the grammar does not parse: Rule 'item' not found"),
])
def test_a_bad_grammar_is_one_clear_error(vocab, kind, text, message):
    with pytest.raises(ValueError, match=message):
        compile_grammar(kind, text, vocab)


def test_masks_follow_the_grammar(tiny_model, vocab):
    state = GrammarState(compile_grammar("json_schema", json.dumps(SCHEMA), vocab))
    (brace,) = ids(tiny_model, "{")
    assert allowed(state.mask()) == {brace}  # no whitespace, no other opening
    state.advance(ids(tiny_model, '{"name": "ab'))
    inside = allowed(state.mask())
    assert set(ids(tiny_model, 'c"')) <= inside and ids(tiny_model, "cd")[1] in inside
    state.advance(ids(tiny_model, 'c'))  # maxLength 3: only the closing quote is left
    assert allowed(state.mask()) == set(ids(tiny_model, '"'))
    state.advance(ids(tiny_model, '", "ok": true}'))
    assert allowed(state.mask()) == set(tiny_model.tokenizer.eos_ids)  # complete: the end of the answer only
    with pytest.raises(RuntimeError, match="where the grammar forbids it"):
        state.advance(ids(tiny_model, "x"))


def test_json_object_allows_any_object_and_gbnf_its_language(tiny_model, vocab):
    state = GrammarState(compile_grammar("json_object", "", vocab))
    state.advance(ids(tiny_model, '{"a": [1, {"b": null}]}'))
    assert allowed(state.mask()) == set(tiny_model.tokenizer.eos_ids)
    state = GrammarState(compile_grammar("gbnf", 'root ::= ("yes" | "no") "."', vocab))
    assert allowed(state.mask()) == {ids(tiny_model, "y")[0], ids(tiny_model, "n")[0]}


def test_forced_tokens_are_the_one_continuation(tiny_model, vocab):
    state = GrammarState(compile_grammar("json_schema", json.dumps(SCHEMA), vocab))
    skeleton = ids(tiny_model, '{"name": "')
    assert state.forced(32) == skeleton[: len(state.forced(32))] and len(state.forced(32)) >= 8
    assert state.forced(3) == skeleton[:3]
    state.advance(ids(tiny_model, '{"name": "a'))
    assert state.forced(8) == []  # a choice: more of the name, or its end
    state.advance(ids(tiny_model, '"'))
    assert state.forced(32) == ids(tiny_model, ', "ok": ')[: len(state.forced(32))] != []


def test_a_draft_tree_is_walked_and_the_state_rolled_back(tiny_model, vocab):
    """Root -> {'{', 'x'}; '{' -> '"' -> 'n'; 'x' -> '"': 'x' is forbidden and its child goes with it; each kept
    node's mask is the mask after its own path; the state is where it was."""
    state = GrammarState(compile_grammar("json_schema", json.dumps(SCHEMA), vocab))
    (brace,), (x,), (quote,), (n,) = (ids(tiny_model, c) for c in '{x"n')
    before = state.mask()
    kept, masks = state.walk([brace, x, quote, quote, n], [-1, -1, 0, 1, 2])
    assert kept == [0, 2, 4]
    assert torch.equal(masks[0], before)
    assert allowed(masks[1]) == {quote}
    assert allowed(masks[2]) == {n}
    assert torch.equal(state.mask(), before)  # rolled back
    chain_kept, chain_masks = state.walk([brace, quote, x], [-1, 0, 1])  # 'x' after '{"' is no key
    assert chain_kept == [0, 1] and torch.equal(chain_masks, masks[:3])
    assert torch.equal(state.mask(), before)


def test_a_draft_ending_the_answer_leaves_the_state_as_it_was(tiny_model, vocab):
    """A draft that closes the value and then drafts the end of the answer: the end token is kept (the grammar
    allows it there) and ends its branch, and the state is where it was, so committing the accepted part
    works (found by the agentic bench: suffix drafting under a schema then raised 'forbids it')."""
    state = GrammarState(compile_grammar("json_schema", json.dumps(SCHEMA), vocab))
    state.advance(ids(tiny_model, '{"name": "a", "ok": true'))
    (close,), eos = ids(tiny_model, "}"), tiny_model.tokenizer.eos_ids[0]
    before = state.mask()
    kept, masks = state.walk([close, eos, close], [-1, 0, 1])  # nothing may follow the end of the answer
    assert kept == [0, 1]
    assert allowed(masks[1]) == allowed(masks[2]) == set(tiny_model.tokenizer.eos_ids)
    assert torch.equal(state.mask(), before)
    state.advance([close])  # the accepted '}' commits
    assert allowed(state.mask()) == set(tiny_model.tokenizer.eos_ids)
    state.advance([eos])
