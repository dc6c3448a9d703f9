"""Tokenizer and chat template, built from GGUF metadata or a tokenizer.json.

Byte-level BPE (the `gpt2` tokenizer model of GGUF, used by SmolLM2, Qwen2.5, Qwen3,
Llama 3) is built with the `tokenizers` library from the file's vocabulary and
merges, with the pre-tokenizer split that `tokenizer.ggml.pre` names. SentencePiece
(the `llama` tokenizer model: Llama 2, Mistral, Gemma) is built from the vocabulary's
scores and token types by specdec.model.spm.
"""

from __future__ import annotations

import re
from pathlib import Path

from specdec.model.errors import ModelFileError

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {"qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
           "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT}
# Llama 3's vocabulary, as llama.cpp reads it: a word that is a token is that token whatever the merges say
# (tokenizer.json's "ignore_merges"), and a BOS starts every text unless the file says not to (Llama 3.x GGUF
# files carry no tokenizer.ggml.add_bos_token)
_LLAMA3_PRES = ("llama-bpe", "llama3", "llama-v3")
_GPT2_PRES = (None, "default", "gpt-2", "gpt2")  # GPT-2's own split (ByteLevel's regex)
_CONTROL, _USER_DEFINED = 3, 4


class Tokenizer:
    def __init__(self, backend, bos_id: int | None, eos_ids: list[int], add_bos: bool, chat_template: str | None,
                 source: str):
        self.backend = backend  # tokenizers.Tokenizer
        self.bos_id = bos_id
        self.eos_ids = eos_ids  # generation stops at any of these
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.source = source  # "gguf" or "tokenizer.json"
        self.kind = type(backend.model).__name__  # the tokenizer algorithm: BPE, Unigram, WordPiece, ...

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of text; a ValueError where text is not Unicode that UTF-8 can hold (a lone surrogate: what
        Python makes of bytes that are not UTF-8 in argv or stdin, or a JSON string's unpaired \\ud800)."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"the text is not valid UTF-8: character {exc.start} is {text[exc.start]!r}, a byte "
                             "that is not UTF-8 or an unpaired surrogate") from None
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def encode_at_most(self, text: str, limit: int, add_bos: bool | None = None) -> list[int] | None:
        """Token ids of text, or None where it has more than `limit` tokens, found without encoding the whole of
        a text far longer than that: tokenizing holds the GIL, and Gemma's tokenizer took 285 s over 2 MB.
        When the first 16 characters per allowed token hold more than limit + 64 tokens, the text cannot fit
        (the cut changes at most the last few tokens of that head)."""
        head = 16 * (limit + 1)
        if len(text) > head and len(self.encode(text[:head], add_bos)) > limit + 64:
            return None
        ids = self.encode(text, add_bos)
        return ids if len(ids) <= limit else None

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def token_text(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render messages with the model's own Jinja template (sandboxed)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; use a plain prompt instead of --chat")
        env = _template_environment()
        bos = self.token_text(self.bos_id) if self.bos_id is not None else ""
        eos = self.token_text(self.eos_ids[0]) if self.eos_ids else ""
        try:
            template = env.from_string(self.chat_template)
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos,
                                   eos_token=eos)
        except ValueError:  # the template's own raise_exception: its message says what is wrong
            raise
        except Exception as exc:  # the template is the model's code: any failure of it (a syntax error,
            # an undefined name, 'a' + 1, a sandbox refusal) is one error naming it, never a traceback
            raise ValueError(f"the model's chat template failed: {type(exc).__name__}: {exc}") from None


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a byte-fallback token's text


def _template_environment():
    """The Jinja environment chat templates are written for: transformers' (sandboxed, trim_blocks and
    lstrip_blocks, {% break %} / {% continue %}, {% generation %} blocks rendered as their body, tojson
    that keeps non-ASCII and the keys' order, raise_exception and strftime_now)."""
    import json
    from datetime import datetime

    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):  # marks the assistant's text for training masks; here only its text
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def raise_exception(message):
        raise ValueError(f"chat template: {message}")

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class StreamDecoder:
    """The text of a growing list of token ids, decoded a few tokens at a time.

    Decoding the whole output again at every step costs time in its length (0.15 ms for 1000 of
    Qwen2.5's tokens, 0.64 ms for 4000, against a 3 ms decode step of smollm2-135m), so a long answer
    cost time quadratic in its length. Here each push decodes a short window instead: the tokens
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
        decodes as one run: settling "é" at <eot> was wrong once the next byte came)."""
        for i in reversed(self.ids):
            if not self.skip_special or self.tokenizer.decode([i], skip_special=True) != "":
                return self.tokenizer.token_text(i)
        return None


def tokenizer_from_gguf(path, reader, metadata: dict) -> Tokenizer:
    """The tokenizer a GGUF file's metadata describes; ModelFileError for metadata that is missing, of the wrong
    type, or whose per-token arrays do not match the token list (a short score list changed how text split)."""
    from gguf import GGUFValueType

    field = reader.fields.get("tokenizer.ggml.tokens")  # its types and length only: the builders read the arrays
    if field is None or field.types != [GGUFValueType.ARRAY, GGUFValueType.STRING] or not field.data:
        raise ModelFileError(path, "tokenizer.ggml.tokens is missing, empty, or not a list of strings")
    n = len(field.data)  # one entry per array element
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in reader.fields and len(reader.fields[key].data) != n:
            raise ModelFileError(path, f"{key} has {len(reader.fields[key].data)} entries for {n} tokens")
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.unknown_token_id", *_END_IDS):
        value = metadata.get(key)
        if value is not None and not (isinstance(value, int) and 0 <= value < n):
            raise ModelFileError(path, f"{key} is {value!r}, not a token id (0..{n - 1})")
    try:
        return _tokenizer_from_gguf(path, reader, metadata)
    except ModelFileError:
        raise
    except Exception as exc:  # merges that are not "a b" strings, a template of the wrong type, ...
        raise ModelFileError(path, f"its tokenizer metadata is malformed ({type(exc).__name__}: {exc})") from None


def _tokenizer_from_gguf(path, reader, metadata: dict) -> Tokenizer:
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    kind = metadata.get("tokenizer.ggml.model")
    if kind == "llama":
        return _spm_from_gguf(reader, metadata)
    if kind != "gpt2":
        raise ModelFileError(path, f"tokenizer model {kind!r} is not supported yet (specdec builds byte-level BPE, "
                             "'gpt2', and SentencePiece, 'llama'); use an HF folder with tokenizer.json instead")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents() if "tokenizer.ggml.merges" in reader.fields else []
    types = reader.fields["tokenizer.ggml.token_type"].contents() if "tokenizer.ggml.token_type" in reader.fields else []
    vocab = {t: i for i, t in enumerate(tokens)}
    pre = metadata.get("tokenizer.ggml.pre")
    backend = Backend(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], dropout=None,
                                 continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                                 ignore_merges=pre in _LLAMA3_PRES))
    if pre in _SPLITS:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif pre == "smollm":  # SmolLM's own tokenizer.json: single digits, then GPT-2 byte-level
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    elif pre in _GPT2_PRES:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:  # another split of the text into words than the model's: every prompt tokenized otherwise, silently
        raise ModelFileError(path, f"its tokenizer splits text as {pre!r} (tokenizer.ggml.pre), which specdec does "
                             f"not implement yet (it does {', '.join(sorted({*_SPLITS, 'smollm', 'gpt-2'}))}); "
                             "use the model's HF folder (tokenizer.json) instead")
    if pre in ("qwen2", "deepseek-r1-qwen"):  # Qwen's tokenizer.json (and transformers' Qwen2Tokenizer) first
        backend.normalizer = normalizers.NFC()  # composes "a" + U+0301 to "á", as the model was trained
    backend.decoder = decoders.ByteLevel()
    special = [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types) if ty == _CONTROL]
    backend.add_special_tokens(special)
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types)
                        if ty == _USER_DEFINED])
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    return Tokenizer(backend, None if bos is None else int(bos), _end_of_generation(metadata, tokens),
                     bool(metadata.get("tokenizer.ggml.add_bos_token", pre in _LLAMA3_PRES)),
                     metadata.get("tokenizer.chat_template"), "gguf")


def read_gguf_tokenizer(path) -> Tokenizer:
    """The tokenizer of a GGUF file alone, without checking that its model can run here."""
    from specdec.model.gguf_reader import reader_class

    reader = reader_class()(path)
    big = ("tokens", "scores", "token_type", "merges")
    metadata = {key: field.contents() for key, field in reader.fields.items()
                if key.startswith(("general.", "tokenizer.")) and key.split(".")[-1] not in big}
    return tokenizer_from_gguf(path, reader, metadata)


def _spm_from_gguf(reader, metadata: dict) -> Tokenizer:
    from specdec.model.spm import spm_backend

    def array(key):
        return reader.fields[key].contents() if key in reader.fields else []

    tokens, types = array("tokenizer.ggml.tokens"), array("tokenizer.ggml.token_type")
    scores = array("tokenizer.ggml.scores") or [0.0] * len(tokens)
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    # llama.cpp's default: a SentencePiece vocabulary prefixes a space unless the file says not to (Gemma does).
    add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    backend = spm_backend(tokens, scores, types, add_space_prefix, None if unk is None else int(unk))
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    template = metadata.get("tokenizer.chat_template")
    if template is None and str(metadata.get("general.architecture", "")).startswith("gemma") \
            and backend.token_to_id("<start_of_turn>") is not None:
        template = GEMMA_TEMPLATE
    # Without the flag llama.cpp adds BOS to a SentencePiece vocabulary.
    return Tokenizer(backend, None if bos is None else int(bos), _end_of_generation(metadata, tokens),
                     bool(metadata.get("tokenizer.ggml.add_bos_token", True)), template, "gguf")


_END_IDS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
            "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id")
# Spellings llama.cpp ends generation at, whatever EOS the file names (a chat turn's own end token, which
# files often leave out of eot_token_id; Qwen's <|endoftext|> beside <|im_end|>, as its generation_config)
_END_OF_GENERATION = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
                      "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"}


def _end_of_generation(metadata: dict, tokens: list[str]) -> list[int]:
    """The ids generation stops at, as llama.cpp's end-of-generation set: the file's EOS, EOT, EOM and FIM
    pad/repo/separator ids, then every token spelled as one of _END_OF_GENERATION."""
    ids = [int(metadata[k]) for k in _END_IDS if metadata.get(k) is not None]
    ids += [i for i, t in enumerate(tokens) if t in _END_OF_GENERATION]
    return list(dict.fromkeys(ids))


# Gemma's turn format, for Gemma GGUF files written without `tokenizer.chat_template` (as some
# conversions are): a system message opens the first user turn, the assistant speaks as "model",
# every other message is trimmed. It is Gemma's published format, written here, not read from the file.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set system = '' %}{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\n\n' %}{% set messages = messages[1:] %}{% endif %}"
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('conversation roles must alternate user/assistant/user/...') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ system if loop.first else '' }}{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def tokenizer_from_hf_folder(path: Path, raw_config: dict) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    from specdec.model.files import read_json_object

    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise ModelFileError(path, "no tokenizer.json in this folder")
    try:
        backend = Backend.from_file(str(file))
    except Exception as exc:  # tokenizers' own error type
        raise ModelFileError(file, f"not a readable tokenizer.json ({exc})") from None
    cfg_file = Path(path) / "tokenizer_config.json"
    tcfg = read_json_object(cfg_file) if cfg_file.is_file() else {}

    def token_id(value):
        if isinstance(value, dict):
            value = value.get("content")
        return backend.token_to_id(value) if isinstance(value, str) else None

    bos = token_id(tcfg.get("bos_token"))
    if bos is None and isinstance(raw_config.get("bos_token_id"), int):
        bos = raw_config["bos_token_id"]
    # generation stops at config.json's eos_token_id, tokenizer_config's eos_token and generation_config's
    # eos_token_id, as transformers stops: many chat models name their end-of-turn token only in the last
    # (Llama 3 Instruct's <|eot_id|>, Phi-3's <|end|>)
    eos_ids = _token_ids(raw_config.get("eos_token_id"), Path(path) / "config.json")
    tok_eos = token_id(tcfg.get("eos_token"))
    if tok_eos is not None and tok_eos not in eos_ids:
        eos_ids = [tok_eos] + eos_ids
    gen_file = Path(path) / "generation_config.json"
    if gen_file.is_file():
        eos_ids += _token_ids(read_json_object(gen_file).get("eos_token_id"), gen_file)
    eos_ids = list(dict.fromkeys(eos_ids))
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # named templates (Hermes, Command-R): the one named "default", as transformers
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")  # none: no chat template (--chat says so), the model still runs
    if template is not None and not isinstance(template, str):
        raise ModelFileError(cfg_file, f"chat_template is a {type(template).__name__}, not a template")
    template_file = Path(path) / "chat_template.jinja"
    if template is None and template_file.is_file():
        try:
            template = template_file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as exc:
            raise ModelFileError(template_file, f"not a readable UTF-8 template ({exc})") from None
    add_bos = tcfg.get("add_bos_token")
    if add_bos is None:  # not said: what tokenizer.json's post-processor does, as transformers encodes (Llama 3
        # adds <|begin_of_text|> there only; without it a completion prompt had no BOS)
        add_bos = bos is not None and backend.encode("a", add_special_tokens=True).ids[:1] == [bos] \
            and backend.encode("a", add_special_tokens=False).ids[:1] != [bos]
    if not isinstance(add_bos, bool):  # "false" was true
        raise ModelFileError(cfg_file, f"add_bos_token is {add_bos!r}, not true or false")
    return Tokenizer(backend, bos, eos_ids, add_bos, template, "tokenizer.json")


def _token_ids(value, file: Path) -> list[int]:
    """An eos_token_id setting (an id, a list of ids or null) as a list of ids; a ModelFileError otherwise."""
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ModelFileError(file, f"eos_token_id is {value!r}, not a token id or a list of token ids")
    return ids


class TextStream:
    """Text deltas of a growing output that never take back what they sent.

    Holds back an incomplete UTF-8 character, and, when stop strings are set, the last
    (longest stop - 1) characters: a stop string found later starts no earlier than that,
    so the text sent is always a prefix of the final (stop-cut) text. Call `advance` only
    while the request is unfinished (its text holds no stop string yet), then `finish`.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...], skip_special: bool = False):
        self.decoder = StreamDecoder(tokenizer, skip_special)  # the output's text, a window of tokens a step
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.sent = ""

    def advance(self, output: list[int]) -> str:
        """output: the request's tokens so far, of which the last call's are the start."""
        self.decoder.push(output[len(self.decoder.ids) :])
        text = self.decoder.text  # settled: what a later token cannot change
        return self._take(text[: max(0, len(text) - self.hold)])

    def finish(self, final_text: str) -> str:
        return self._take(final_text)

    def _take(self, text: str) -> str:
        if not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent) :], text
        return piece
