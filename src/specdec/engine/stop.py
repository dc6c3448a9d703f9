"""Stop strings: where an answer's text, growing a token at a time, first holds one of them.

    stop = StopStrings(tokenizer, ("\\n\\n", "</answer>"), skip_special=True)
    for t in tokens:
        output.append(t)
        cut = stop.find(output)   # None, or the answer's text up to the earliest stop string
        if cut is not None:
            break
"""

from __future__ import annotations

from typing import Sequence

from specdec.model.text_stream import StreamDecoder
from specdec.model.tokenizer import Tokenizer


class StopStrings:
    """One answer's stop strings and its text so far (a StreamDecoder; skip_special: special tokens'
    text left out, as in the answer's text). Fed the same growing output list each time."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...], skip_special: bool):
        self.tokenizer = tokenizer
        self.stop = stop  # non-empty strings
        self.skip_special = skip_special
        self.text: StreamDecoder | None = None  # made at the first find()

    def find(self, output: Sequence[int]) -> str | None:
        """The text before a stop string the output's text holds now, or None.

        The text grows by a decoded window of tokens (StreamDecoder), and each stop string is looked for
        only where it could end in text new since the last call: one that lay in the settled text was
        found then. Where several end in the new text, the one that starts first wins (llama-server's rule):
        the text is cut before the earliest of them, so that it holds none.
        """
        if self.text is None:
            self.text = StreamDecoder(self.tokenizer, self.skip_special)
        settled = len(self.text.text)
        self.text.push(output[len(self.text.ids) :])
        # pending ends in U+FFFD while its last character is incomplete: that placeholder is no text yet,
        # so a stop string holding U+FFFD never matches part of a character
        text = self.text.text + self.text.pending.rstrip("\ufffd")
        found = [at for s in self.stop if (at := text.find(s, max(0, settled - len(s) + 1))) >= 0]
        return text[: min(found)] if found else None
