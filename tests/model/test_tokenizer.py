"""Tokenizer.encode_at_most: the ids of a text that fits, None for one that does not, and a text far
past the limit is never tokenized whole (the server refuses a 20 MB prompt without stalling); the eos ids
a Hugging Face folder names."""

from __future__ import annotations

import copy
import json

import pytest

from helpers.tiny import make_hf_model
from specdec.engine.engine import Engine
from specdec.model.errors import ModelFileError
from specdec.model.load import load_model
from specdec.sampling import SamplingParams


class Recording:
    """The tokenizers backend, noting the length of every text it encodes."""

    def __init__(self, backend):
        self.backend, self.lengths = backend, []

    def encode(self, text, **kwargs):
        self.lengths.append(len(text))
        return self.backend.encode(text, **kwargs)


def test_encode_at_most_gives_the_ids_or_none_at_the_limit(tiny_model):
    tok = tiny_model.tokenizer
    for text in ("def f(x):\n    return x + 1\n", "é" * 40, "word " * 30):
        ids = tok.encode(text)
        assert tok.encode_at_most(text, len(ids)) == ids
        assert tok.encode_at_most(text, len(ids) + 5) == ids
        assert tok.encode_at_most(text, len(ids) - 1) is None


def test_a_text_far_past_the_limit_is_refused_from_its_head(tiny_model):
    tok = copy.copy(tiny_model.tokenizer)
    tok.backend = Recording(tiny_model.tokenizer.backend)
    assert tok.encode_at_most("word " * 200_000, 100) is None
    assert max(tok.backend.lengths) == 16 * 101  # the head only, not the million characters


def test_generation_config_eos_ids_stop_generation(tmp_path):
    """generation_config.json's eos_token_id stops a run as transformers stops (Llama 3 Instruct names
    <|eot_id|> only there): greedy decoding ends at the first such token, finish_reason "stop"."""
    folder = make_hf_model(tmp_path / "m")
    prompt = [5, 17, 33, 101]
    free = Engine(load_model(str(folder), "fp32", progress=False)).generate(prompt, SamplingParams(), max_tokens=12)
    stop_at = next(i for i, t in enumerate(free.token_ids) if t != 2 and i >= 3)  # a token past the start
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, free.token_ids[stop_at]]}))
    model = load_model(str(folder), "fp32", progress=False)
    assert model.tokenizer.eos_ids[-1] == free.token_ids[stop_at] and 2 in model.tokenizer.eos_ids
    out = Engine(model).generate(prompt, SamplingParams(), max_tokens=12)
    first = free.token_ids.index(free.token_ids[stop_at])  # the token may also come earlier
    assert (out.token_ids, out.finish_reason) == (free.token_ids[:first], "stop")  # the stop token is not output

    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(ModelFileError, match="generation_config.json.*eos_token_id is '</s>', not a token id"):
        load_model(str(folder), "fp32", progress=False)


def test_chat_templates_get_transformers_environment(tiny_model):
    """{% break %}, {% generation %}, tojson keeping non-ASCII and key order, strftime_now: each failed or
    rendered otherwise than transformers renders the same template."""
    import datetime

    tok = tiny_model.tokenizer
    saved = tok.chat_template
    try:
        tok.chat_template = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% generation %}"
                             "{{ m | tojson }}{% endgeneration %}{% endfor %}|{{ strftime_now('%Y') }}")
        text = tok.apply_chat_template([{"role": "user", "content": "é <x> & 'q'"}, {"role": "user", "content": "2"}])
    finally:
        tok.chat_template = saved
    assert text == '{"role": "user", "content": "é <x> & \'q\'"}|' + str(datetime.date.today().year)


def test_a_folder_whose_post_processor_adds_bos_gets_it(tmp_path):
    """Llama 3 folders add <|begin_of_text|> in tokenizer.json's post-processor and leave add_bos_token out of
    tokenizer_config.json: their completion prompts had no BOS (transformers' encode adds it)."""
    import json

    from helpers.tiny import make_hf_model
    from specdec.model.load import open_checkpoint

    folder = make_hf_model(tmp_path / "m")
    raw = json.loads((folder / "tokenizer.json").read_text())
    cfg = json.loads((folder / "tokenizer_config.json").read_text()) if (folder / "tokenizer_config.json").is_file() \
        else {}
    _, tok = open_checkpoint(folder)
    bos_id = tok.bos_id if tok.bos_id is not None else 1
    bos = tok.token_text(bos_id)
    raw["post_processor"] = {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}
    (folder / "tokenizer.json").write_text(json.dumps(raw))
    cfg.pop("add_bos_token", None)
    cfg["bos_token"] = bos
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    _, tok = open_checkpoint(folder)
    assert tok.bos_id == bos_id
    assert tok.encode("hello")[0] == bos_id and tok.encode("hello", add_bos=False)[0] != bos_id
    cfg["add_bos_token"] = False  # said: as said
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    _, tok = open_checkpoint(folder)
    assert tok.encode("hello")[0] != bos_id


@pytest.mark.slow
def test_real_gguf_tokenizers_match_their_models_prompts():
    """Qwen's GGUF tokenizer skipped the NFC normalization its tokenizer.json (and transformers) applies:
    "a" + U+0301 was two tokens where the model saw "á". Gemma's chat template writes <bos> and training
    prompts added another (serving prompts have one)."""
    from specdec.model.catalogue import model_path
    from specdec.model.gguf_tokenizer import read_gguf_tokenizer
    from specdec.train.data import chat_prompt_ids

    for name in ("qwen2.5-coder-0.5b", "gemma3-270m"):
        if not model_path(name).is_file():
            pytest.skip(f"{name} is not pulled (specdec pull {name})")
    qwen = read_gguf_tokenizer(model_path("qwen2.5-coder-0.5b"))
    assert qwen.encode("a\u0301 e\u0301 combining", add_bos=False) == qwen.encode("\u00e1 \u00e9 combining",
                                                                                    add_bos=False)
    gemma = read_gguf_tokenizer(model_path("gemma3-270m"))
    ids = chat_prompt_ids(gemma, "hi")
    assert ids[0] == gemma.bos_id and ids[1] != gemma.bos_id
    assert ids == gemma.encode(gemma.apply_chat_template([{"role": "user", "content": "hi"}]), add_bos=False)


def test_a_gguf_stops_where_llama_cpp_stops(tmp_path):
    """Qwen's GGUF names <|im_end|> as EOS; llama.cpp (and Qwen's generation_config) also end at <|endoftext|>,
    which specdec generated past. The end-of-generation set: the file's EOS/EOT/EOM ids, then llama.cpp's
    spellings."""
    from helpers.tiny import make_gguf_model
    from specdec.model.gguf_tokenizer import read_gguf_tokenizer

    tok = read_gguf_tokenizer(make_gguf_model(tmp_path / "m.gguf"))
    assert [tok.token_text(i) for i in tok.eos_ids] == ["<|im_end|>", "<|endoftext|>"]


def _bpe_gguf(path, pre: str, tokens: list[str], merges: list[str], add_bos: bool | None = None):
    """A GGUF holding a byte-level BPE tokenizer alone (token 0 its BOS)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_bos_token_id(0)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("pre", ["llama-bpe", "llama3", "llama-v3"])
def test_llama3_vocabularies_match_whole_words_and_add_bos_as_llama_cpp(tmp_path, pre):
    """llama.cpp reads Llama 3's vocabulary with ignore_merges (a word that is a token is that token, as
    tokenizer.json says) and a BOS unless the file says otherwise (Llama 3.x GGUFs do not say): specdec merged
    "abc" into "ab" "c" and left the BOS out."""
    from specdec.model.gguf_tokenizer import read_gguf_tokenizer

    tokens = ["<|begin_of_text|>", "a", "b", "c", "ab", "abc"]
    llama3 = read_gguf_tokenizer(_bpe_gguf(tmp_path / "l.gguf", pre, tokens, ["a b"]))
    assert llama3.encode("abc") == [0, 5]
    said = read_gguf_tokenizer(_bpe_gguf(tmp_path / "n.gguf", pre, tokens, ["a b"], add_bos=False))
    assert said.encode("abc") == [5]
    gpt2 = read_gguf_tokenizer(_bpe_gguf(tmp_path / "g.gguf", "gpt-2", tokens, ["a b"]))
    assert gpt2.encode("abc") == [4, 3]  # merges only, no BOS: GPT-2's reading
