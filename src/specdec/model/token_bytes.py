"""The bytes each token id stands for, what a grammar engine matches tokens against.

Byte-level BPE (GPT-2's scheme: SmolLM2, Qwen2.5, Llama 3) spells each byte as one printable character
(bytes_to_unicode below), so a token's bytes are its characters mapped back. SentencePiece vocabularies
(Gemma, Llama 2) spell a space as "▁" and a byte the vocabulary lacks as a <0xNN> token. Added tokens
are their text; special ones (<|im_start|>, <eos>) are listed apart, as no grammar text can spell them.

    vocab = token_bytes(model.tokenizer, model.config.vocab_size)
    vocab.tokens[id] -> b'{"', vocab.special -> (0, 1, 2, ...)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True)
class TokenBytes:
    """tokens[i]: the bytes token i decodes to (b"" for an id past the tokenizer's vocabulary);
    special: ids that stand for no text (control tokens, and ids the tokenizer does not have)."""

    tokens: tuple[bytes, ...]
    special: tuple[int, ...]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table: printable bytes stand for themselves, the other 68 are moved
    to characters from 256 up, so that every byte has a visible spelling."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


def token_bytes(tokenizer, vocab_size: int) -> TokenBytes:
    """The bytes of every id below vocab_size (the model's rows, which may outnumber the tokenizer's ids).

    tokenizer: specdec.model.tokenizer.Tokenizer. ValueError for a vocabulary that is neither byte-level
    BPE nor SentencePiece-style (WordPiece, say): its tokens' bytes are not written in them.
    """
    backend = tokenizer.backend
    decoder = repr(backend.decoder)
    if "ByteLevel" in decoder:
        chars = {c: b for b, c in bytes_to_unicode().items()}

        def spell(text: str) -> bytes:
            return bytes(chars[c] for c in text) if all(c in chars for c in text) else text.encode()
    elif "\u2581" in decoder or "Metaspace" in decoder:
        def spell(text: str) -> bytes:
            byte = _BYTE_TOKEN.fullmatch(text)
            return bytes([int(byte.group(1), 16)]) if byte else text.replace("\u2581", " ").encode()
    else:
        raise ValueError(f"constrained decoding reads byte-level BPE and SentencePiece vocabularies; this "
                         f"tokenizer decodes with {decoder[:80]}, so the bytes of its tokens are not known")
    added = backend.get_added_tokens_decoder()  # {id: AddedToken}
    tokens, special = [], []
    for i in range(vocab_size):
        token = added.get(i)
        text = token.content if token is not None else backend.id_to_token(i)
        if text is None or (token is not None and token.special):
            special.append(i)
        tokens.append(b"" if text is None else text.encode() if token is not None else spell(text))
    return TokenBytes(tuple(tokens), tuple(special))
