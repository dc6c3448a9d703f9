"""A growing output's text, decoded a few tokens at a time (StreamDecoder), and sent as deltas that never
take back what they sent (TextStream: holds back an incomplete character and a possible stop string's start)."""

from __future__ import annotations

import bisect
import re

from specdec.model.tokenizer import Tokenizer

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a byte-fallback token's text


class StreamDecoder:
    """The text of a growing list of token ids, decoded a few tokens at a time.

    Decoding the whole output again at every step would cost time in its length (0.15 ms for 1000 of
    Qwen2.5's tokens, 0.64 ms for 4000, against a 3 ms decode step of smollm2-135m): a long answer's
    time quadratic in its length. Here each push decodes a short window instead: the tokens
    since the last settled point, after the few before it as context (a SentencePiece decoder drops
    the space that starts its text, and a window of context keeps that space where it belongs).

        stream = StreamDecoder(tokenizer)
        stream.push([9707, 11])  # -> "Hello," : the text these tokens settled
        stream.text + stream.pending == tokenizer.decode(stream.ids, skip_special)  # always

    `text` is settled: it ends on a whole character and never changes; `pending` is the text of the
    tokens after it while they end inside a UTF-8 character (ending in U+FFFD) or with a byte token
    ("<0xE6>": SentencePiece's byte fallback decodes a run of them together, so a character already
    whole turns to U+FFFD again if a byte that cannot follow it comes next). Where a window's text does
    not extend its context's (a decoder that does not work piecewise), the whole list is decoded.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        """skip_special: leave special tokens' text out (<|im_start|>, <end_of_turn>), as an answer's text."""
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.ids: list[int] = []
        self.text = ""
        self.pending = ""
        self._context = 0  # ids[_context:_settled] decode to the end of text: the window's context
        self._settled = 0  # ids[:_settled] decode to text

    def push(self, ids) -> str:
        """Append ids; returns the text they settled ("" while a character is incomplete)."""
        self.ids.extend(ids)

        def decode(ids):  # skip_special only when asked: a tokenizer-like object may take ids alone
            return self.tokenizer.decode(ids, skip_special=True) if self.skip_special else self.tokenizer.decode(ids)

        before = decode(self.ids[self._context : self._settled])
        window = decode(self.ids[self._context :])
        # a context that decodes to nothing (a skipped special token) keeps no SentencePiece space: the
        # window's text would lose the one that starts it ("hello<end_of_turn> world" -> "helloworld")
        if window.startswith(before) and (before or not self._settled):
            new = window[len(before) :]
        else:  # not piecewise: decode the whole list
            full = decode(self.ids)
            if not full.startswith(self.text):
                raise RuntimeError("the tokenizer's decoding of this output changed text already settled")
            new = full[len(self.text) :]
        last = self._last_shown()
        if new.endswith("\ufffd") or (last is not None and _BYTE_TOKEN.fullmatch(last)):
            self.pending = new
            return ""
        self.text += new
        self.pending = ""
        self._context, self._settled = self._settled, len(self.ids)
        return new

    def _last_shown(self) -> str | None:
        """The text of the last token whose text the decoding shows: skipped special tokens at the end are
        passed over, since a byte token after them joins the byte run before them (<0xC3><0xA9><eot><0xA9>
        decodes as one run: "é" is not settled at <eot>)."""
        for i in reversed(self.ids):
            if not self.skip_special or self.tokenizer.decode([i], skip_special=True) != "":
                return self.tokenizer.token_text(i)
        return None


class TextStream:
    """Text deltas of a growing output that never take back what they sent.

    Holds back an incomplete UTF-8 character, and, when stop strings are set, the last
    (longest stop - 1) characters: a stop string found later starts no earlier than that,
    so the text sent is always a prefix of the final (stop-cut) text. Call `advance` only
    while the request is unfinished (its text holds no stop string yet), then `finish`.

    track_tokens: also know which token each character of the text came from (`ends`, `pieces`, `sent_tokens`):
    the tokens are then decoded one at a time, which costs a decode per token.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...], skip_special: bool = False, track_tokens: bool = False):
        self.decoder = StreamDecoder(tokenizer, skip_special)  # the output's text, a window of tokens a step
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.sent = ""
        self.track_tokens = track_tokens
        # ends[i]: characters of the settled text once token i was pushed (a token that settled no character,
        # e.g. the first bytes of one, ends where the one before it does; the character goes to its last token)
        self.ends: list[int] = []
        self.last = (0, 0)  # the characters of the text the last advance or finish sent: [start, end)

    def advance(self, output: list[int]) -> str:
        """output: the request's tokens so far, of which the last call's are the start."""
        self._push(output)
        text = self.decoder.text  # settled: what a later token cannot change
        return self._take(text[: max(0, len(text) - self.hold)])

    def finish(self, final_text: str, output: list[int] | None = None) -> str:
        """final_text: the whole answer's text (stop-cut); output: its tokens, with track_tokens."""
        if output is not None:
            self._push(output)
        return self._take(final_text)

    def pieces(self, start: int, end: int) -> list[tuple[int, int]]:
        """The characters [start, end) of the text as (token index, characters) runs, one per token, in order;
        characters past the last settled token's end (the last tokens' pending text) go to the last token.

        Tokens "He", "llo", "" (a skipped special token), " you": ends [2, 5, 5, 9], and
        pieces(1, 7) == [(0, 1), (1, 3), (3, 2)].
        """
        if not self.ends:
            return []
        out, i = [], bisect.bisect_right(self.ends, start)
        while start < end:
            stop = end if i >= len(self.ends) - 1 else min(end, self.ends[i])
            if stop > start:
                out.append((min(i, len(self.ends) - 1), stop - start))
            start, i = stop, i + 1
        return out

    def sent_tokens(self) -> int:
        """How many leading tokens have their text wholly in the text sent so far, the last of them one with
        text (a token that settled no character waits for the token whose text it starts). With track_tokens.

        Tokens "He", "llo", "" (a first byte), "é": ends [2, 5, 5, 6]; once "Hello" is sent, 2.
        """
        n = bisect.bisect_right(self.ends, len(self.sent))
        while n and self.ends[n - 1] == (self.ends[n - 2] if n > 1 else 0):  # no text of its own
            n -= 1
        return n

    def _push(self, output: list[int]) -> None:
        new = output[len(self.decoder.ids) :]
        if not self.track_tokens:
            self.decoder.push(new)
            return
        for token in new:
            self.decoder.push([token])
            self.ends.append(len(self.decoder.text))

    def _take(self, text: str) -> str:
        if not text.startswith(self.sent):
            self.last = (len(self.sent), len(self.sent))
            return ""
        piece, self.sent = text[len(self.sent) :], text
        self.last = (len(self.sent) - len(piece), len(self.sent))
        return piece
