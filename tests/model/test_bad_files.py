"""Bad input: each gets one clear error naming the file and the problem."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from helpers.tiny import make_gguf_model, make_hf_model
from specdec.model.errors import ModelFileError, SpecdecError
from specdec.model.load import load_model
from specdec.model.catalogue import MODELS, model_path, resolve


def _load(path):
    return load_model(str(path), "fp32", progress=False)


def test_truncated_gguf(tmp_path):
    path = make_gguf_model(tmp_path / "t.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelFileError, match=r"t\.gguf: .*truncated"):
        _load(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(ModelFileError, match=r"x\.gguf: not a GGUF file"):
        _load(path)


def test_header_garbage(tmp_path):
    path = tmp_path / "g.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(ModelFileError, match=r"g\.gguf: not a readable GGUF file"):
        _load(path)


def _writer(path, arch="llama", blocks=1):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(blocks)
    return w


def _finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unknown_architecture(tmp_path):
    path = tmp_path / "m.gguf"
    w = _writer(path, "mamba")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    _finish(w)
    with pytest.raises(ModelFileError, match="architecture 'mamba' is not supported"):
        _load(path)


@pytest.mark.parametrize("heads, length, extra, message", [
    (0, 8, {}, "llama.attention.head_count is 0; a whole number of at least 1"),  # was ZeroDivisionError
    (2, "eight", {}, "llama.context_length is 'eight'; a whole number"),  # was a bare ValueError
    (2, 8, {"llama.attention.head_count_kv": 0}, "head_count_kv is 0"),  # was read as "all heads"
    (2, 8, {"llama.rope.freq_base": 0.0}, "llama.rope.freq_base is 0.0; a positive number"),  # was 10000
    (2, 8, {"llama.block_count": 4_000_000_000}, "block_count says 4000000000 layers, but the file holds layers up"),
    (2, 8, {"llama.expert_count": 8}, "llama.expert_count is 8: a mixture-of-experts model"),  # said a tensor missing
])
def test_gguf_metadata_of_the_wrong_value(tmp_path, heads, length, extra, message):
    path = tmp_path / "m.gguf"
    extra = dict(extra)
    w = _writer(path, blocks=extra.pop("llama.block_count", 1))
    w.add_embedding_length(4)
    w.add_head_count(heads)
    w.add_feed_forward_length(8)
    (w.add_context_length if isinstance(length, int) else lambda v: w.add_string("llama.context_length", v))(length)
    for key, value in extra.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(key, value)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    _finish(w)
    with pytest.raises(ModelFileError, match=message):
        _load(path)


def test_unknown_quantization(tmp_path):
    path = tmp_path / "q.gguf"
    w = _writer(path)
    iq = gguf.GGMLQuantizationType.IQ4_NL  # 32 values in 18 bytes; not a type specdec loads
    w.add_tensor("token_embd.weight", np.zeros((8, 18), dtype=np.uint8), raw_dtype=iq)
    _finish(w)
    with pytest.raises(ModelFileError, match="token_embd.weight has quantization IQ4_NL"):
        _load(path)


def _rewritten_gguf(tmp_path, tensors=lambda name, array: array, fields=lambda name, value: value, extra=None):
    """The tiny GGUF written again with each tensor and metadata value passed through the functions (a field
    whose function gives None is left out), and the tensors of `extra` ({GGUF name: array}) added."""
    reader = gguf.GGUFReader(make_gguf_model(tmp_path / "ok.gguf"))
    bad = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(bad), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = fields(field.name, field.contents())
        if value is not None:
            w.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        w.add_tensor(t.name, tensors(t.name, np.array(t.data)))
    for name, array in (extra or {}).items():
        w.add_tensor(name, array)
    _finish(w)
    return bad


def test_a_tensor_no_layer_reads_is_refused(tmp_path):
    """A GGUF tensor that no name of the architecture's model maps (here gpt-oss's attention sinks, and a
    classifier head) vanished at load, and the model computed something else than its file's."""
    sinks = {f"blk.{i}.attn_sinks.weight": np.ones(4, dtype=np.float32) for i in range(2)}
    with pytest.raises(ModelFileError, match=r"tensor blk.0.attn_sinks.weight \(and 1 more: blk.1.attn_sinks.weight\) "
                                             r"is not one specdec's llama model reads; running without it would change"):
        _load(_rewritten_gguf(tmp_path, extra=sinks))
    with pytest.raises(ModelFileError, match=r"tensor cls.weight is not one specdec's llama model reads"):
        _load(_rewritten_gguf(tmp_path, extra={"cls.weight": np.ones((2, 64), dtype=np.float32)}))
    # llama.cpp's RoPE frequency factors are read apart (Llama 3.x's scaling): not refused
    assert _load(_rewritten_gguf(tmp_path, extra={"rope_freqs.weight": np.ones(8, dtype=np.float32)})) is not None


def test_tensor_of_the_wrong_shape(tmp_path):
    bad = _rewritten_gguf(tmp_path, tensors=lambda name, a: a[:-4] if name == "blk.0.attn_q.weight" else a)
    with pytest.raises(ModelFileError, match=r"blk\.0\.attn_q\.weight has shape \(60, 64\), expected \(64, 64\)"):
        _load(bad)


@pytest.mark.parametrize("weights", ["gguf", "fp32"])
def test_an_output_head_of_the_wrong_width_is_refused(tmp_path, weights):
    """The gguf kernel read the head's rows past their end (no error, garbage logits)."""
    bad = _rewritten_gguf(tmp_path, tensors=lambda name, a: a[:, :-32] if name == "output.weight" else a)
    with pytest.raises(ModelFileError, match=r"output\.weight has shape \(512, 32\), expected \(512, 64\)"):
        load_model(str(bad), weights, progress=False)


def test_a_block_count_below_the_layers_in_the_file_is_refused(tmp_path):
    """The model ran without its last layer, predicting other text (llama.cpp refuses such a file)."""
    bad = _rewritten_gguf(tmp_path, fields=lambda name, v: 1 if name == "llama.block_count" else v)
    with pytest.raises(ModelFileError, match=r"holds layer 1, but its block_count says 1 layers"):
        _load(bad)


@pytest.mark.parametrize("key, value, message", [
    ("tokenizer.ggml.token_type", lambda v: v[:-5], r"token_type has 507 entries for 512 tokens"),  # split otherwise
    ("tokenizer.ggml.tokens", lambda v: None, r"tokenizer.ggml.tokens is missing"),  # was a KeyError
    ("tokenizer.ggml.eos_token_id", lambda v: 9999, r"eos_token_id is 9999, not a token id \(0..511\)"),
    ("tokenizer.ggml.merges", lambda v: ["ab"] * 3, r"tokenizer metadata is malformed"),  # was a TypeError
    # was GPT-2's split, silently: every prompt tokenized otherwise than the model's (llama.cpp refuses it)
    ("tokenizer.ggml.pre", lambda v: "tekken", r"its tokenizer splits text as 'tekken' \(tokenizer.ggml.pre\), "
                                               r"which specdec does not implement yet"),
])
def test_broken_gguf_tokenizer_metadata_is_one_error(tmp_path, key, value, message):
    bad = _rewritten_gguf(tmp_path, fields=lambda name, v: value(v) if name == key else v)
    with pytest.raises(ModelFileError, match=message):
        _load(bad)


def test_a_turns_end_token_stops_a_bpe_gguf_as_a_sentencepiece_one(tmp_path):
    """A byte-level BPE file naming <|endoftext|> as EOS ran past <|im_end|>, the end of every chat turn
    (the SentencePiece builder already stopped at such tokens, as llama.cpp does for every vocabulary)."""
    bad = _rewritten_gguf(tmp_path, fields=lambda name, v: 0 if name == "tokenizer.ggml.eos_token_id" else v)
    tok = _load(bad).tokenizer
    assert tok.token_text(0) == "<|endoftext|>" and tok.token_text(2) == "<|im_end|>"
    assert set(tok.eos_ids) == {0, 2}


def test_a_tokenizer_with_more_tokens_than_the_model_has_rows_is_refused(tmp_path):
    """The prompt token past the rows failed only at generation ("outside the vocabulary")."""
    bad = _rewritten_gguf(tmp_path, fields=lambda name, v: v + [f"<extra{i}>" for i in range(5)] if name in (
        "tokenizer.ggml.tokens",) else v + [1] * 5 if name == "tokenizer.ggml.token_type" else v)
    with pytest.raises(ModelFileError, match="its tokenizer has 517 tokens but the model 512 token rows"):
        _load(bad)


def test_a_bias_in_layer_0_only_is_refused(tmp_path):
    path = make_gguf_model(tmp_path / "b.gguf", extra_weights={
        f"model.layers.0.self_attn.{n}_proj.bias": torch.zeros(size) for n, size in zip("qkv", (64, 32, 32))})
    with pytest.raises(ModelFileError, match=r"model.layers.1.self_attn.q_proj.bias is missing"):  # a KeyError
        _load(path)


def test_a_named_pipe_as_the_model_is_refused_at_once(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(SpecdecError, match="is not a regular file or a folder"):  # open() waited for ever
        resolve(str(tmp_path / "fifo"))


def _shards(folder, split: dict[str, str]):
    """Move tensors of model.safetensors into other files: name -> file."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    for name, file in split.items():
        extra = load_file(str(folder / file)) if (folder / file).exists() else {}
        save_file({**extra, name: tensors.pop(name)}, str(folder / file))
    save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize("edit, message", [
    (lambda f: (_edit_config(f, quantization_config={"quant_method": "fp8"}),
                _add_tensor(f, "model.layers.0.mlp.up_proj.weight_scale_inv", torch.ones(1))),
     r"a quantized checkpoint \(a quantization tensor \(.*weight_scale_inv\); quantization_config: fp8\)"),
    (lambda f: _add_tensor(f, "model.layers.0.mlp.up_proj.weight", torch.zeros(128, 64, dtype=torch.int8)),
     r"weights of type I8"),
    (lambda f: _add_tensor(f, "lm_head.weight", torch.zeros(520, 64)), r"lm_head.weight has 520 rows, more than"),
    (lambda f: (_shards(f, {"lm_head.weight": "model-00002-of-00002.safetensors"}),
                (f / "model-00002-of-00002.safetensors").unlink()),
     r"lm_head.weight is missing, and config.json says tie_word_embeddings: false"),
    (lambda f: (f / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.norm.weight": "model.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}})),
     r"model-00002-of-00002.safetensors, named by model.safetensors.index.json, is missing"),
    (lambda f: _add_tensor(f, "model.norm.weight", torch.ones(64), file="stale.safetensors"),
     r"tensor model.norm.weight is in both model.safetensors and stale.safetensors"),
    (lambda f: _edit_config(f, rope_scaling={"rope_type": "llama3", "factor": None}), r"rope_scaling"),
])
def test_a_folder_that_would_compute_another_model_is_refused(tmp_path, edit, message):
    """Each loaded before: scales ignored, the head silently tied, a stale copy picked, or a traceback."""
    folder = make_hf_model(tmp_path / "m")
    edit(folder)
    with pytest.raises(ModelFileError, match=message):
        _load(folder)


@pytest.mark.parametrize("settings, jinja, message", [
    ({"chat_template": 5}, None, "chat_template is a int, not a template"),  # failed at the first --chat
    ({"add_bos_token": "false"}, None, "add_bos_token is 'false', not true or false"),  # it was read as true
    ({}, b"\xff{{ messages }}", r"chat_template.jinja: not a readable UTF-8 template"),
])
def test_tokenizer_settings_of_the_wrong_form_are_refused(tmp_path, settings, jinja, message):
    folder = make_hf_model(tmp_path / "m")
    tcfg = folder / "tokenizer_config.json"
    raw = json.loads(tcfg.read_text()) if tcfg.is_file() else {}
    if jinja:  # the template comes from the file
        raw.pop("chat_template", None)
    tcfg.write_text(json.dumps({**raw, **settings}))
    if jinja:
        (folder / "chat_template.jinja").write_bytes(jinja)
    with pytest.raises(ModelFileError, match=message):
        _load(folder)


def test_named_chat_templates_use_the_default_one(tmp_path):
    folder = make_hf_model(tmp_path / "m")
    tcfg = folder / "tokenizer_config.json"
    raw = json.loads(tcfg.read_text()) if tcfg.is_file() else {}
    templates = [{"name": "tool_use", "template": "T{{ messages[0]['content'] }}"},
                 {"name": "default", "template": "D{{ messages[0]['content'] }}"}]
    tcfg.write_text(json.dumps({**raw, "chat_template": templates}))
    assert _load(folder).tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "Dhi"
    tcfg.write_text(json.dumps({**raw, "chat_template": templates[:1], "add_bos_token": None}))
    assert _load(folder).tokenizer.chat_template is None  # no default: no template, and the model still loads


def test_a_float_folder_with_integer_buffers_or_a_stale_quantization_config_loads(tmp_path):
    folder = make_hf_model(tmp_path / "m")
    _edit_config(folder, quantization_config={"quant_method": "bitsandbytes"})  # kept by a float re-save
    _add_tensor(folder, "model.layers.0.self_attn.rotary_emb.cache", torch.zeros(4, dtype=torch.uint8))
    assert _load(folder).config.num_layers == 2


def _edit_config(folder, **values):
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, **values}))


def _add_tensor(folder, name, tensor, file="model.safetensors"):
    from safetensors.torch import load_file, save_file

    path = folder / file
    tensors = load_file(str(path)) if path.exists() else {}
    save_file({**tensors, name: tensor}, str(path))


@pytest.mark.parametrize("arch, drop, swap, message", [
    ("qwen3", "model.layers.1.self_attn.k_norm.weight", None, "k_norm.weight"),  # it ran without the norm
    ("qwen2", None, ("k_proj.bias", 64), r"k_proj\.bias has shape \(64,\); .* imply \(32,\)"),  # read past the end
])
@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_a_missing_norm_or_a_bias_of_the_wrong_length_is_refused(tmp_path, arch, drop, swap, message, weights):
    from safetensors.torch import load_file, save_file

    folder = make_hf_model(tmp_path / "m", arch=arch)
    tensors = load_file(str(folder / "model.safetensors"))
    if drop:
        del tensors[drop]
    if swap:
        tensors["model.layers.0.self_attn." + swap[0]] = torch.zeros(swap[1])
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ModelFileError, match=message):
        load_model(str(folder), weights, progress=False)


def test_wrong_sha256_refuses_to_load(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    path = model_path("smollm2-135m")
    path.parent.mkdir(parents=True)
    make_gguf_model(path)  # a valid GGUF, but not the file the checksum names
    with pytest.raises(SpecdecError, match="sha256 does not match the expected checksum for smollm2-135m"):
        resolve("smollm2-135m")
    assert MODELS["smollm2-135m"].sha256 != ""


def test_a_specdec_home_that_is_a_file_is_one_error(tmp_path, monkeypatch):
    """It was a NotADirectoryError traceback from `specdec pull` and from the first `generate`."""
    home = tmp_path / "home"
    home.write_text("")
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    with pytest.raises(SpecdecError, match=r"pull smollm2-135m: Not a directory .*set it to a folder you can write"):
        resolve("smollm2-135m")


def test_unknown_name_or_missing_path():
    with pytest.raises(SpecdecError, match="neither a known model name"):
        resolve("no-such-model-anywhere")


def test_hf_folder_with_pickled_weights_only(tmp_path):
    folder = make_hf_model(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 pickle")
    with pytest.raises(ModelFileError, match="pickled .bin weights are never loaded"):
        _load(folder)


def test_hf_folder_unknown_model_type(tmp_path):
    folder = make_hf_model(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match="model_type 'gpt_neox' is not supported"):
        _load(folder)


def test_hf_folder_missing_config_key(tmp_path):
    folder = make_hf_model(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["hidden_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match="config.json lacks 'hidden_size'"):
        _load(folder)


@pytest.mark.parametrize("change, message", [
    ({"num_key_value_heads": 0}, "num_key_value_heads is 0; expected a whole number of at least 1"),  # was: all heads
    ({"num_hidden_layers": -1}, "num_hidden_layers is -1; expected a whole number of at least 1"),
    ({"num_hidden_layers": 2.5}, "num_hidden_layers is 2.5; expected a whole number"),  # was: 2 layers
    ({"rope_scaling": "linear"}, "rope_scaling is 'linear'; expected an object of settings"),
    ({"rope_theta": "1e4"}, "rope_theta is '1e4'; expected a finite number"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps is -1e-06; expected a number of at least 0"),
    # a complex attention scale, then a ctypes traceback at the first forward; 0 became 256
    ({"query_pre_attn_scalar": -16}, "query_pre_attn_scalar is -16; expected a positive number"),
    ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar is 0; expected a positive number"),
    ({"rope_parameters": {"full_attention": [1]}}, r"rope_parameters.full_attention is \[1\]; expected an object"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings is 'yes'; expected true or false"),
    ({"hidden_act": 3}, "hidden_act is 3; expected a string"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_heads 4 is not a multiple of num_kv_heads 3"),
    # ids 512..999 passed the prompt check and then indexed past the embedding (a 500 on the server)
    ({"vocab_size": 1000}, "embed_tokens.weight has 512 rows, fewer than the vocab_size 1000 config.json declares"),
])
def test_hf_config_value_of_the_wrong_type(tmp_path, change, message):
    """Each was a TypeError/AttributeError traceback or a silently different model."""
    folder = make_hf_model(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ModelFileError, match=message):
        _load(folder)


def test_an_odd_head_dim_is_refused_at_load(tmp_path):
    """RoPE rotates pairs of dimensions: head_dim 15 loaded and failed in the first forward (RuntimeError)."""
    folder = make_hf_model(tmp_path / "m", hidden=60, heads=4, kv_heads=2)
    with pytest.raises(ModelFileError, match="head_dim is 15; RoPE needs an even head dimension"):
        _load(folder)


def test_hf_config_null_is_the_default(tmp_path):
    folder = make_hf_model(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": None, "max_position_embeddings": None}))
    config = _load(folder).transformer.config
    assert (config.rms_norm_eps, config.context_length) == (1e-6, 4096)


@pytest.mark.parametrize("file, content, message", [
    ("config.json", "[1, 2]", "config.json: holds a JSON list, not an object of settings"),
    ("config.json", b"\xff\xfe{}", "config.json: not valid JSON"),
    ("tokenizer_config.json", "[]", "tokenizer_config.json: holds a JSON list"),
    ("tokenizer_config.json", '{"eos_token": ', "tokenizer_config.json: not valid JSON"),
    ("tokenizer.json", "{garbage", "tokenizer.json: not a readable tokenizer.json"),
])
def test_hf_folder_with_a_damaged_settings_file(tmp_path, file, content, message):
    folder = make_hf_model(tmp_path / "m")
    target = folder / file
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ModelFileError, match=message):
        _load(folder)


@pytest.mark.parametrize("name, tensor, message", [
    ("model.norm.weight", torch.ones(3), r"tensor model.norm.weight has shape \(3,\); .* imply \(64,\)"),
    ("model.layers.1.input_layernorm.weight", torch.ones(()), r"input_layernorm.weight has shape \(\)"),
    ("model.layers.0.self_attn.q_proj.weight", torch.zeros(32, 64),
     r"q_proj.weight \+ .*k_proj.weight \+ .*v_proj.weight: shape \(96, 64\); .* imply \(128, 64\)"),
    ("model.layers.0.mlp.up_proj.weight", torch.zeros(128, 64, 1), r"gate_proj.weight \+ .*up_proj.weight: shape"),
    ("model.embed_tokens.weight", torch.zeros(512, 32), r"embed_tokens.weight has shape \(512, 32\); rows of 64"),
])
@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_a_tensor_of_another_shape_than_the_config_says(tmp_path, name, tensor, message, weights):
    """The C kernels trust the shapes: a short norm weight was read past its end, with no error."""
    folder = make_hf_model(tmp_path / "m", extra_tensors={name: tensor})
    with pytest.raises(ModelFileError, match=message):
        load_model(str(folder), weights, progress=False)


def test_unknown_weight_format(tiny_hf_dir):
    with pytest.raises(ValueError, match="unknown weight format 'int3'"):
        load_model(str(tiny_hf_dir), "int3", progress=False)


@pytest.mark.parametrize("book", ["[1, 2]", '{"a": ', "null"])
def test_a_damaged_digest_book_is_a_cache_miss_and_is_rewritten(tmp_path, monkeypatch, book):
    import hashlib

    from specdec.model.catalogue import cached_sha256

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    (tmp_path / "sha256.json").write_text(book)
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"specdec" * 100)
    assert cached_sha256(weights) == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert list(json.loads((tmp_path / "sha256.json").read_text()).values()) == [cached_sha256(weights)]


def _biases(names="qkv", seed=3):
    g = torch.Generator().manual_seed(seed)
    size = {"q": 64, "k": 32, "v": 32, "o": 64}
    return {f"model.layers.{i}.self_attn.{n}_proj.bias": 0.5 * torch.randn(size[n], generator=g)
            for i in range(2) for n in names}


def _logits(path):
    tr = load_model(str(path), "fp32", progress=False, weight_cache=False).transformer
    cache = tr.new_cache(16)
    return tr.forward(torch.tensor([[5, 9, 77, 100, 3, 250]]), cache, [cache.allocate()]).logits


def test_biases_the_layers_do_not_add_are_refused(tmp_path):
    """attention_bias: true gives o_proj a bias too (transformers): specdec added q/k/v's and dropped o's,
    every logit off (0.34 on a tiny Llama); a GGUF's blk.N.attn_output.bias vanished the same way."""
    folder = make_hf_model(tmp_path / "m", extra_config={"attention_bias": True}, extra_tensors=_biases("qkvo"))
    with pytest.raises(ModelFileError, match=r"tensor model.layers.0.self_attn.o_proj.bias \(and 1 more\): "
                                             r"specdec's layers have no such bias"):
        _logits(folder)
    gguf_path = make_gguf_model(tmp_path / "o.gguf", extra_weights=_biases("o"))
    with pytest.raises(ModelFileError, match=r"tensor blk.0.attn_output.bias: specdec's layers have no such bias"):
        _logits(gguf_path)


def test_llama_gguf_q_k_biases_are_unpermuted_like_their_weights(tmp_path):
    """llama.cpp's converter permutes q/k biases as it permutes the weights' rows; only the weights were
    put back (logits 0.04 off transformers')."""
    biases = _biases("qkv")
    folder = make_hf_model(tmp_path / "m", extra_config={"attention_bias": True}, extra_tensors=biases)
    gguf_path = make_gguf_model(tmp_path / "m.gguf", extra_weights=biases)
    torch.testing.assert_close(_logits(gguf_path), _logits(folder), rtol=1e-5, atol=1e-5)


def test_qwen2_biases_are_read_whatever_attention_bias_says(tmp_path):
    """transformers' Qwen2 always has q/k/v biases; "attention_bias": false made specdec drop them."""
    plain = make_hf_model(tmp_path / "a", arch="qwen2")
    said = make_hf_model(tmp_path / "b", arch="qwen2", extra_config={"attention_bias": False})
    assert torch.equal(_logits(plain), _logits(said))


def test_a_tied_head_that_differs_from_the_embedding_is_refused(tmp_path):
    """tie_word_embeddings: true beside its own lm_head.weight: transformers 4 ties, 5 keeps the head, and
    specdec used the embedding (every argmax off on a tiny model); which is meant is not known."""
    g = torch.Generator().manual_seed(5)
    folder = make_hf_model(tmp_path / "m", extra_config={"tie_word_embeddings": True},
                           extra_tensors={"lm_head.weight": torch.randn(512, 64, generator=g)})
    with pytest.raises(ModelFileError, match="tie_word_embeddings: true, but lm_head.weight differs"):
        _logits(folder)


def test_llama_reads_hidden_act_only(tmp_path):
    """A Llama config with hidden_activation but no hidden_act runs silu in transformers (it reads only
    hidden_act); specdec ran the other activation."""
    import json

    plain = make_hf_model(tmp_path / "a")
    odd = make_hf_model(tmp_path / "b")
    raw = json.loads((odd / "config.json").read_text())
    raw.pop("hidden_act", None)
    raw["hidden_activation"] = "gelu_pytorch_tanh"
    (odd / "config.json").write_text(json.dumps(raw))
    assert torch.equal(_logits(plain), _logits(odd))
