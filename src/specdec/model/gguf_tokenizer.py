"""The tokenizer a GGUF file's metadata describes.

Byte-level BPE (the `gpt2` tokenizer model of GGUF, used by SmolLM2, Qwen2.5, Qwen3,
Llama 3) is built with the `tokenizers` library from the file's vocabulary and
merges, with the pre-tokenizer split that `tokenizer.ggml.pre` names. SentencePiece
(the `llama` tokenizer model: Llama 2, Mistral, Gemma) is built from the vocabulary's
scores and token types by specdec.model.spm. Gemma 4's (`gemma4`) is BPE by merges over SentencePiece-style
pieces with byte fallback, built with the `tokenizers` library.
"""

from __future__ import annotations

from gguf import GGUFValueType
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

from specdec.model.chat_template import GEMMA_TEMPLATE
from specdec.model.errors import ModelFileError
from specdec.model.gguf_reader import reader_class
from specdec.model.spm import spm_backend
from specdec.model.tokenizer import Tokenizer

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


def tokenizer_from_gguf(path, reader, metadata: dict) -> Tokenizer:
    """The tokenizer a GGUF file's metadata describes; ModelFileError for metadata that is missing, of the wrong
    type, or whose per-token arrays do not match the token list (a short score list would change how text splits)."""
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
    kind = metadata.get("tokenizer.ggml.model")
    if kind == "llama":
        return _spm_from_gguf(reader, metadata)
    if kind == "gemma4":
        return _gemma4_from_gguf(reader, metadata)
    if kind != "gpt2":
        raise ModelFileError(path, f"tokenizer model {kind!r} is not supported yet (specdec builds byte-level BPE, "
                             "'gpt2', SentencePiece, 'llama', and Gemma 4's, 'gemma4'); use an HF folder with tokenizer.json "
                             "instead")
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
    reader = reader_class()(path)
    big = ("tokens", "scores", "token_type", "merges")
    metadata = {key: field.contents() for key, field in reader.fields.items()
                if key.startswith(("general.", "tokenizer.")) and key.split(".")[-1] not in big}
    return tokenizer_from_gguf(path, reader, metadata)


def _spm_from_gguf(reader, metadata: dict) -> Tokenizer:
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


def _gemma4_from_gguf(reader, metadata: dict) -> Tokenizer:
    """Gemma 4's (tokenizer model gemma4), as llama.cpp reads it: BPE by the file's merges over SentencePiece-style
    pieces (each space a '▁', no prefix), on raw UTF-8 with <0xNN> byte fallback, the text split only into runs
    of newlines and runs of anything else; a BOS first unless the file says not to."""
    def array(key):
        return reader.fields[key].contents() if key in reader.fields else []

    tokens, types = array("tokenizer.ggml.tokens"), array("tokenizer.ggml.token_type")
    backend = Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, dropout=None, fuse_unk=False,
                                 merges=[tuple(m.split(" ", 1)) for m in array("tokenizer.ggml.merges")],
                                 byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types)
                                if ty == _CONTROL])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types)
                        if ty == _USER_DEFINED])
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    return Tokenizer(backend, None if bos is None else int(bos), _end_of_generation(metadata, tokens),
                     bool(metadata.get("tokenizer.ggml.add_bos_token", True)), metadata.get("tokenizer.chat_template"),
                     "gguf")


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
