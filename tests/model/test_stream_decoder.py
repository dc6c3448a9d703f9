"""StreamDecoder: the text of a growing output, decoded a window at a time, is the text of decoding it whole."""

from __future__ import annotations

import random

import pytest

from specdec.model.text_stream import StreamDecoder


class ByteTokenizer:
    """Token i is byte i; decoding is UTF-8 with U+FFFD for what is not a whole character, as in byte-level BPE."""

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")

    def token_text(self, token_id):
        return None


class CharTokenizer:
    """Token i is chr(i), through a decode function."""

    def __init__(self, decode):
        self._decode = decode

    def decode(self, ids):
        return self._decode("".join(chr(i) for i in ids))

    def token_text(self, token_id):
        return None


def push_all(stream, ids, chunks):
    """Push ids in chunks of the given sizes, checking the invariants after each push; returns the pieces."""
    pieces, at = [], 0
    for size in chunks:
        settled = stream.text
        pieces.append(stream.push(ids[at : at + size]))
        at += size
        assert stream.text == settled + pieces[-1]  # settled text only grows
        assert stream.text + stream.pending == stream.tokenizer.decode(stream.ids)
        assert not stream.text.endswith("\ufffd")
    return pieces


def test_characters_split_across_tokens_wait_until_whole():
    text = "a é 日本 🤖 z"
    data = list(text.encode())
    stream = StreamDecoder(ByteTokenizer())
    pieces = push_all(stream, data, [1] * len(data))
    assert "".join(pieces) == stream.text == text
    assert [p for p in pieces if p] == list(text)  # one character at a time, each when its last byte came
    assert not stream.pending


def test_bytes_that_never_make_a_character_match_the_whole_decode():
    rng = random.Random(3)
    for _ in range(200):
        data = [rng.choice([0x41, 0x20, 0xC3, 0xA9, 0xE3, 0x81, 0x82, 0xF0, 0x9F, 0xFF]) for _ in range(rng.randint(1, 24))]
        chunks = []
        while sum(chunks) < len(data):
            chunks.append(rng.randint(1, 3))
        stream = StreamDecoder(ByteTokenizer())
        push_all(stream, data, chunks)


def test_a_window_that_reads_differently_falls_back_to_the_whole_text():
    # a decoder that drops leading underscores from two or more tokens but not from one: the window "_b"
    # reads "b" where its context "_" reads "_"; the whole text still extends what was settled
    stream = StreamDecoder(CharTokenizer(lambda s: s.lstrip("_") if len(s) > 1 else s))
    pieces = push_all(stream, [ord(c) for c in "a_b"], [1, 1, 1])
    assert pieces == ["a", "_", "b"]


def test_a_decoder_that_rewrites_settled_text_is_an_error():
    stream = StreamDecoder(CharTokenizer(lambda s: s[::-1]))
    assert stream.push([ord("a"), ord("b")]) == "ba"
    with pytest.raises(RuntimeError, match="changed text already settled"):
        stream.push([ord("c")])


TEXTS = [
    "def merge_sort(items):\n    \"\"\"Sort a list.\"\"\"\n    return sorted(items)  # ok\n",
    "  leading spaces, then   runs   of spaces and\ttabs\n\n\nand blank lines",
    "Grüße aus Köln! 日本語のテキスト、絵文字 🤖🎉 and ünïcödé ñ",
    "<|im_start|>user\nhi<|im_end|>\n<start_of_turn>model\nok<end_of_turn>",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
def test_real_tokenizers_stream_their_whole_decode(name):
    """Byte-level BPE (SmolLM2, Qwen2.5) and SentencePiece with byte tokens (Gemma 3): real text and random
    ids (special and byte tokens among them), pushed a few at a time, give the whole decode at every step."""
    from specdec.model.catalogue import model_path
    from specdec.model.gguf_tokenizer import read_gguf_tokenizer

    tok = read_gguf_tokenizer(model_path(name))
    rng = random.Random(11)
    vocab = tok.backend.get_vocab_size()
    sequences = [tok.encode(text, add_bos=False) for text in TEXTS]
    sequences += [[rng.randrange(vocab) for _ in range(rng.randint(1, 60))] for _ in range(40)]
    sequences += [[rng.randrange(300) for _ in range(40)] for _ in range(20)]  # byte tokens and specials
    for ids in sequences:
        chunks = []
        while sum(chunks) < len(ids):
            chunks.append(rng.randint(1, 4))
        stream = StreamDecoder(tok)
        pieces = push_all(stream, ids, chunks)
        assert "".join(pieces) == stream.text
    assert "".join(push_all(StreamDecoder(tok), sequences[2], [1] * len(sequences[2]))) == tok.decode(sequences[2])


def owner_of_each_character(ids) -> list[int]:
    """The reference for TextStream.pieces, from prefix decodes: a character belongs to the token whose
    prefix first decodes it whole (ByteTokenizer: the token of its last byte)."""
    tok, owners = ByteTokenizer(), []
    for i in range(len(ids)):
        whole = tok.decode(ids[: i + 1]).rstrip("\ufffd")  # the text holds no U+FFFD of its own
        owners += [i] * (len(whole) - len(owners))
    return owners


@pytest.mark.parametrize("stop", [(), ("日本 X",)])
def test_text_stream_pieces_give_each_character_to_the_token_that_completed_it(stop):
    from specdec.model.text_stream import TextStream

    text = "a é 日本 🤖 z"
    data = list(text.encode())
    rng = random.Random(5)
    for _ in range(20):
        stream = TextStream(ByteTokenizer(), stop, track_tokens=True)
        owners, at = [], 0
        while at < len(data):
            at = min(len(data), at + rng.randint(1, 4))
            piece = stream.advance(data[:at])
            runs = stream.pieces(*stream.last)
            assert sum(n for _, n in runs) == len(piece)  # the runs cover the piece exactly
            assert [i for i, _ in runs] == sorted({i for i, _ in runs})  # one run per token, in order
            owners += [i for i, n in runs for _ in range(n)]
        piece = stream.finish(text, data)
        owners += [i for i, n in stream.pieces(*stream.last) for _ in range(n)]
        assert stream.sent == text
        assert owners == owner_of_each_character(data)


@pytest.mark.parametrize("stop", [(), ("日本 X",)])
def test_text_stream_sent_tokens_end_on_the_last_token_whose_character_went_out(stop):
    """A streamed chunk's logprobs are those of TextStream.sent_tokens: the tokens up to the one that owns the
    last character sent; a character's first bytes wait for the byte that completes it."""
    from specdec.model.text_stream import TextStream

    text = "a é 日本 🤖 z"
    data = list(text.encode())
    owners = owner_of_each_character(data)
    rng = random.Random(7)
    for _ in range(20):
        stream, at = TextStream(ByteTokenizer(), stop, track_tokens=True), 0
        while at < len(data):
            at = min(len(data), at + rng.randint(1, 4))
            stream.advance(data[:at])
            sent = len(stream.sent)
            assert stream.sent_tokens() == (owners[sent - 1] + 1 if sent else 0)
