"""SentencePiece tokenizers built from GGUF metadata (`tokenizer.ggml.model` = "llama").

The reference is SentencePiece itself (sentencepiece==0.2.3), loaded from a ModelProto written here
from the same pieces, scores and types: Gemma, Llama 2 and Mistral shipped SentencePiece BPE models,
and llama.cpp's tokenizer reimplements that one. Control tokens in the text are split off before
SentencePiece sees it (SentencePiece itself never matches them; llama.cpp and transformers do).
"""

from __future__ import annotations

import os
import random
import re
import struct

import pytest

from specdec.model.chat_template import GEMMA_TEMPLATE
from specdec.model.gguf_tokenizer import read_gguf_tokenizer
from specdec.model.spm import SpmMerger
from specdec.model.text_stream import StreamDecoder

UNK, CONTROL, USER_DEFINED, UNUSED, BYTE, NORMAL = 2, 3, 4, 5, 6, 1
SPECIALS = [("<unk>", UNK), ("<s>", CONTROL), ("</s>", CONTROL), ("<start_of_turn>", CONTROL),
            ("<end_of_turn>", CONTROL), ("\n\n", USER_DEFINED), ("  ", USER_DEFINED)]
CHARS = "▁abcdefghijklmnopqrstuvwxyzé.,!?'"
# Merged pieces, best first. "ab" is UNUSED: merged through, never emitted (SentencePiece splits it back).
MERGED = ["ab", "▁t", "he", "▁the", "ll", "▁he", "llo", "▁hello", "or", "▁w", "▁wor", "ld", "▁world",
          "in", "ing", "abc"]


def tiny_vocab(with_unused: bool = True):
    tokens, scores, types = [], [], []
    for t, ty in SPECIALS:
        tokens.append(t), scores.append(0.0), types.append(ty)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>"), scores.append(0.0), types.append(BYTE)
    for k, c in enumerate(CHARS):
        tokens.append(c), scores.append(-100.0 - k), types.append(NORMAL)
    for k, piece in enumerate(MERGED):
        tokens.append(piece), scores.append(-1.0 - k), types.append(UNUSED if piece == "ab" and with_unused else NORMAL)
    return tokens, scores, types


def write_spm_gguf(path, tokens, scores, types, add_space_prefix=False, arch="llama", template=None, **extra):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(tokens.index("<unk>"))
    w.add_bos_token_id(tokens.index("<s>"))
    w.add_eos_token_id(tokens.index("</s>"))
    w.add_add_space_prefix(add_space_prefix)
    for key, value in extra.items():
        getattr(w, f"add_{key}")(value)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --- the reference: a SentencePiece ModelProto, written by hand (no protobuf package needed) ---

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, value) -> bytes:
    if isinstance(value, bytes):  # length-delimited (wire type 2)
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    if isinstance(value, float):  # fixed32 (wire type 5)
        return _varint(number << 3 | 5) + struct.pack("<f", value)
    return _varint(number << 3) + _varint(value)  # varint (wire type 0)


def sentencepiece_model(tokens, scores, types, unk_id: int, add_dummy_prefix: bool):
    """A SentencePiece BPE model with byte fallback over the GGUF's pieces.

    User-defined pieces get back the "▁" that the GGUF converter turned into spaces, since
    SentencePiece matches them after its own space escaping. SentencePiece wants its one unknown
    piece typed UNKNOWN (Gemma's file types it control).
    """
    import sentencepiece

    parts = []
    for i, (piece, score, ty) in enumerate(zip(tokens, scores, types)):
        piece = piece.replace(" ", "▁") if ty == USER_DEFINED else piece
        ty = UNK if i == unk_id else CONTROL if ty == UNK else ty
        parts.append(_field(1, _field(1, piece.encode()) + _field(2, float(score)) + _field(3, ty)))
    # TrainerSpec: model_type BPE, vocab_size, byte_fallback, unk/bos/eos/pad ids (only unk is a real piece).
    parts.append(_field(2, _field(3, 2) + _field(4, len(tokens)) + _field(35, 1) + _field(40, unk_id)
                        + _field(41, -1) + _field(42, -1) + _field(43, -1)))
    # NormalizerSpec: identity, add_dummy_prefix, no whitespace squeezing, escape spaces as "▁".
    parts.append(_field(3, _field(1, b"identity") + _field(3, int(add_dummy_prefix)) + _field(4, 0) + _field(5, 1)))
    return sentencepiece.SentencePieceProcessor(model_proto=b"".join(parts))


def reference_encoder(tokens, scores, types, unk_id: int = 0, add_dummy_prefix: bool = False):
    """Token ids as SentencePiece gives them, with control tokens in the text split off first."""
    sp = sentencepiece_model(tokens, scores, types, unk_id, add_dummy_prefix)
    special = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (UNK, CONTROL)}
    pattern = re.compile("|".join(re.escape(t) for t in sorted(special, key=len, reverse=True)))

    def encode(text):
        ids, pos = [], 0
        for m in pattern.finditer(text):
            ids += sp.encode(text[pos : m.start()]) if m.start() > pos else []
            ids.append(special[m.group()])
            pos = m.end()
        return ids + (sp.encode(text[pos:]) if pos < len(text) else [])

    return encode


TINY_TEXTS = ["the hello world", "hello  world\n\nthe end.", "abc abd ab abcabc", "日本 🤖 café!",
              "<start_of_turn>the world<end_of_turn>\n\n", "   three spaces, then\ttab", "", " ", "thing's",
              "x" * 30 + " " * 7 + "é" * 5, "<s></s><unk>hello<s>"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokens, scores, types = tiny_vocab()
    path = write_spm_gguf(tmp_path_factory.mktemp("spm") / "tiny-spm.gguf", tokens, scores, types)
    return read_gguf_tokenizer(path)


def pieces(tok, ids):
    return [tok.token_text(i) for i in ids]


def test_tiny_ids_match_sentencepiece(tiny, tmp_path):
    reference = reference_encoder(*tiny_vocab())
    for text in TINY_TEXTS:
        assert tiny.encode(text, add_bos=False) == reference(text), text
    # without unused pieces the merge loop runs chunk by chunk, with a cache
    vocab = tiny_vocab(with_unused=False)
    tok, reference = read_gguf_tokenizer(write_spm_gguf(tmp_path / "c.gguf", *vocab)), reference_encoder(*vocab)
    for text in TINY_TEXTS + [" ".join(TINY_TEXTS)]:
        assert tok.encode(text, add_bos=False) == reference(text), text


def test_merge_loop_matches_sentencepiece_on_random_vocabularies():
    rng = random.Random(0)
    for _ in range(40):
        chars = "ab▁c"
        merged = sorted({"".join(rng.choice(chars) for _ in range(rng.randint(2, 4))) for _ in range(12)})
        tokens = ["<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + list(chars) + merged
        scores = [0.0] * 257 + [-100.0] * len(chars) + [-float(s) for s in rng.sample(range(1, 99), len(merged))]
        types = [UNK] + [BYTE] * 256 + [NORMAL] * (len(chars) + len(merged))
        sp = sentencepiece_model(tokens, scores, types, 0, add_dummy_prefix=False)
        merger = SpmMerger({t: s for t, s, ty in zip(tokens, scores, types) if ty == NORMAL})
        for _ in range(30):
            text = "".join(rng.choice(chars + "d") for _ in range(rng.randint(1, 16)))
            expected = [tokens[i] for i in sp.encode(text.replace("▁", " "))]
            ours = [p if p in tokens else f"<0x{ord(p):02X}>" for p in merger.pieces(text)]
            assert ours == expected, (text, merged)


def test_tiny_hand_computed_pieces(tiny):
    assert pieces(tiny, tiny.encode(" the hello world", add_bos=False)) == ["▁the", "▁hello", "▁world"]
    # "ab" is an unused piece: merged through to reach "abc", split back into "a" "b" otherwise
    assert pieces(tiny, tiny.encode("abc abd", add_bos=False)) == ["abc", "▁", "a", "b", "d"]
    assert pieces(tiny, tiny.encode("日!", add_bos=False)) == ["<0xE6>", "<0x97>", "<0xA5>", "!"]
    assert pieces(tiny, tiny.encode("a\n\nb  c<end_of_turn>", add_bos=False)) == [
        "a", "\n\n", "b", "  ", "c", "<end_of_turn>"]


def test_tiny_metadata_and_round_trip(tiny):
    assert (tiny.bos_id, tiny.eos_ids, tiny.add_bos, tiny.kind) == (1, [2, 4], True, "BPE")  # 4: <end_of_turn>
    assert tiny.vocab_size == len(tiny_vocab()[0])
    assert tiny.encode("he")[0] == 1
    for text in TINY_TEXTS:
        assert tiny.decode(tiny.encode(text, add_bos=False)) == text
    assert tiny.decode(tiny.encode("<s>hello"), skip_special=True) == "hello"


def test_stream_decoder_assembles_byte_tokens(tiny):
    text = "the 日本 🤖 world"
    ids = tiny.encode(text, add_bos=False)
    stream = StreamDecoder(tiny)
    out = []
    for i in ids:
        out.append(stream.push([i]))
        assert stream.text + stream.pending == tiny.decode(stream.ids)
        assert text.startswith(stream.text)  # never a character the next byte token turns back to U+FFFD
    assert "".join(out) == text
    # after a whole character of byte tokens, a byte that cannot follow it makes the run U+FFFD again:
    # that character stays pending until a token that is not a byte comes
    ni = tiny.encode("日", add_bos=False)
    stream = StreamDecoder(tiny)
    assert stream.push(ni) == "" and stream.pending == "日"
    assert stream.push(ni[:1]) == "" and stream.pending == tiny.decode(ni + ni[:1])
    assert not any("\ufffd" in piece for piece in out)


def test_space_prefix_follows_llama_cpp(tmp_path):
    """add_space_prefix: every stretch of text gets a "▁", the one after a special token too (llama.cpp)."""
    tokens, scores, types = tiny_vocab()
    tok = read_gguf_tokenizer(write_spm_gguf(tmp_path / "p.gguf", tokens, scores, types, add_space_prefix=True))
    assert pieces(tok, tok.encode("the hello", add_bos=False)) == ["▁the", "▁hello"]
    assert pieces(tok, tok.encode("hello<end_of_turn>the", add_bos=False)) == ["▁hello", "<end_of_turn>", "▁the"]
    assert tok.decode(tok.encode("the hello")) == "<s> the hello"  # as llama.cpp and transformers print it
    assert tok.decode(tok.encode("the hello"), skip_special=True) == "the hello"
    reference = reference_encoder(tokens, scores, types, add_dummy_prefix=True)
    for text in ["the hello world", "<start_of_turn>the world<end_of_turn>hello", "日本 café"]:
        assert tok.encode(text, add_bos=False) == reference(text), text
    # Where the two differ, llama.cpp is followed: it matches the user-defined "  " in the raw text and
    # then prefixes the text after it too; SentencePiece prefixes once, then matches on "▁▁" (it gives
    # ["  "] and ["▁", "a", "  ", "b"] here). No Gemma file meets this: Gemma sets add_space_prefix false.
    assert pieces(tok, tok.encode(" ", add_bos=False)) == ["▁", "▁"]
    assert pieces(tok, tok.encode("a  b", add_bos=False)) == ["▁", "a", "  ", "▁", "b"]


def test_chat_template_from_file_and_gemma_fallback(tmp_path):
    tokens, scores, types = tiny_vocab()
    own = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    tok = read_gguf_tokenizer(write_spm_gguf(tmp_path / "t.gguf", tokens, scores, types, template=own))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user]hi"
    plain = read_gguf_tokenizer(write_spm_gguf(tmp_path / "n.gguf", tokens, scores, types))
    assert plain.chat_template is None
    gemma = read_gguf_tokenizer(write_spm_gguf(tmp_path / "g.gguf", tokens, scores, types, arch="gemma3"))
    assert gemma.chat_template == GEMMA_TEMPLATE
    assert gemma.eos_ids == [2, tokens.index("<end_of_turn>")]


def test_merge_loop_prefers_best_score_then_leftmost():
    merger = SpmMerger({"ab": -1.0, "bc": -1.0, "cab": -0.5})
    assert merger.pieces("abc") == ["ab", "c"]  # ab and bc tie: the leftmost wins
    assert merger.pieces("abcab") == ["ab", "cab"]  # cab (best) takes c first
    assert merger.pieces("") == [] and merger.pieces("x") == ["x"]


# --- the real file: Gemma 3 270M (slow) ---

GEMMA_TEXTS = [
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n\tpivot = xs[0]  # 123456789\n",
    "The quick brown fox jumps over the lazy dog. It's 3.14159 - isn't it? \"Quotes\" (parens) [brackets]",
    "Ünïcödé: naïve café, 日本語のテキスト, 中文字符, 한국어, emoji 🤖🚀👨‍👩‍👧‍👦, Ελληνικά, кириллица — “quotes”…",
    "RTL: שלום עולם, مرحبا بالعالم; rare: 𝔘𝔫𝔦 \U0001F9EC \u200b zero-width",
    "   leading spaces\n\n\nnewlines\r\n and tabs\t\tx=1e-5;" + " " * 40 + "after forty spaces\t\t\t\t",
    "<start_of_turn>user\nHello there!<end_of_turn>\n<start_of_turn>model\n<b>bold</b> <bos><eos> [multimodal]",
    "",
]


@pytest.fixture(scope="module")
def gemma_file():
    from specdec.model import catalogue

    if "gemma3-270m" in catalogue.MODELS:
        path = catalogue.model_path("gemma3-270m")
        reason = f"{path} is not present; run `specdec pull gemma3-270m`"
    else:
        path = os.environ.get("SPECDEC_GEMMA3_GGUF", "")
        reason = "no gemma3-270m in specdec's model catalog and SPECDEC_GEMMA3_GGUF names no file"
    if not path or not os.path.isfile(path):
        pytest.skip(reason)
    return path


@pytest.mark.slow
def test_gemma3_ids_match_sentencepiece(gemma_file):
    from specdec.model.gguf_reader import reader_class

    tok = read_gguf_tokenizer(gemma_file)
    fields = reader_class()(gemma_file).fields
    vocab = [fields[f"tokenizer.ggml.{k}"].contents() for k in ("tokens", "scores", "token_type")]
    reference = reference_encoder(*vocab, unk_id=3)
    for text in GEMMA_TEXTS:
        ids = tok.encode(text, add_bos=False)
        assert ids == reference(text), text
        assert tok.decode(ids) == text
    assert tok.encode("Hi")[:1] == [tok.bos_id] == [2]
    assert (tok.eos_ids, tok.add_bos, tok.vocab_size) == ([1, 106], True, 262144)


@pytest.mark.slow
def test_gemma3_chat_template_renders_two_turns(gemma_file):
    tok = read_gguf_tokenizer(gemma_file)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello.\n"}, {"role": "user", "content": "2+2?"}]
    text = tok.apply_chat_template(messages)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                    "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n")
    ids = tok.encode(text, add_bos=False)
    assert ids[:4] == [2, 105, 2364, 107] and ids[-3:] == [105, 4368, 107]
    with pytest.raises(ValueError, match="alternate"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_a_skipped_special_token_keeps_the_next_words_space_in_a_stream(tmp_path):
    """With skip_special (an answer's text) a window whose context was only a special token decoded
    without it, so SentencePiece dropped the space that starts the window: 'helloworld' streamed where the
    whole text is 'hello world', and TextStream.finish then sent nothing more (not a prefix)."""
    from specdec.model.text_stream import TextStream

    tokens, scores, types = tiny_vocab()
    tok = read_gguf_tokenizer(write_spm_gguf(tmp_path / "p.gguf", tokens, scores, types, add_space_prefix=True))
    eot = tokens.index("<end_of_turn>")
    ids = tok.encode("hello", add_bos=False) + [eot] + tok.encode("world the end", add_bos=False)
    whole = tok.decode(ids, skip_special=True)
    assert whole == "hello world the end"
    stream = StreamDecoder(tok, skip_special=True)
    for i in ids:
        stream.push([i])
    assert stream.text + stream.pending == whole
    text = TextStream(tok, (), skip_special=True)
    pieces_sent = [text.advance(ids[:k]) for k in range(1, len(ids) + 1)]
    assert "".join(pieces_sent) + text.finish(whole) == whole
    empty = StreamDecoder(tok)  # an empty push is a context that decodes to nothing too
    for chunk in (ids[:1], [], ids[2:3], ids[3:]):
        empty.push(chunk)
    assert empty.text + empty.pending == tok.decode(ids[:1] + ids[2:])


def test_a_skipped_special_token_inside_a_byte_run_does_not_settle_it(tiny):
    """<0xC3><0xBC><start_of_turn><0xBC>: with special tokens skipped the three bytes decode as one run, so the
    "ü" settled at <start_of_turn> turned to U+FFFD with the next byte, and push raised RuntimeError."""
    u_umlaut = tiny.encode("ü", add_bos=False)
    sot = tiny.backend.token_to_id("<start_of_turn>")
    assert len(u_umlaut) == 2 and all(tiny.token_text(i).startswith("<0x") for i in u_umlaut)
    ids = u_umlaut + [sot] + u_umlaut[1:] + tiny.encode(" the", add_bos=False)
    stream = StreamDecoder(tiny, skip_special=True)
    for i in ids:
        stream.push([i])
        assert stream.text + stream.pending == tiny.decode(stream.ids, skip_special=True)
    assert stream.text == tiny.decode(ids, skip_special=True)
