"""The Tokenizer (a `tokenizers` backend, its BOS and end-of-generation ids, its chat template), and
the one a Hugging Face folder's tokenizer.json describes. A GGUF file's is built by
model/gguf_tokenizer.py; the chat template renders through model/chat_template.py, and text
streams out through model/text_stream.py.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as Backend

from specdec.model.chat_template import template_environment
from specdec.model.errors import ModelFileError
from specdec.model.files import read_json_object


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

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        """Render messages with the model's own Jinja template (sandboxed); tools: OpenAI's function tools, which
        a template that knows them writes into the prompt (None: the template's own answer without tools)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; use a plain prompt instead of --chat")
        env = template_environment()
        bos = self.token_text(self.bos_id) if self.bos_id is not None else ""
        eos = self.token_text(self.eos_ids[0]) if self.eos_ids else ""
        try:
            template = env.from_string(self.chat_template)
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos,
                                   eos_token=eos, **({"tools": tools} if tools else {}))
        except ValueError:  # the template's own raise_exception: its message says what is wrong
            raise
        except Exception as exc:  # the template is the model's code: any failure of it (a syntax error,
            # an undefined name, 'a' + 1, a sandbox refusal) is one error naming it, never a traceback
            raise ValueError(f"the model's chat template failed: {type(exc).__name__}: {exc}") from None


def tokenizer_from_hf_folder(path: Path, raw_config: dict) -> Tokenizer:
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
        # adds <|begin_of_text|> there only)
        add_bos = bos is not None and backend.encode("a", add_special_tokens=True).ids[:1] == [bos] \
            and backend.encode("a", add_special_tokens=False).ids[:1] != [bos]
    if not isinstance(add_bos, bool):  # the string "false" would read as true
        raise ModelFileError(cfg_file, f"add_bos_token is {add_bos!r}, not true or false")
    return Tokenizer(backend, bos, eos_ids, add_bos, template, "tokenizer.json")


def _token_ids(value, file: Path) -> list[int]:
    """An eos_token_id setting (an id, a list of ids or null) as a list of ids; a ModelFileError otherwise."""
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ModelFileError(file, f"eos_token_id is {value!r}, not a token id or a list of token ids")
    return ids
