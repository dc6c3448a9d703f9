"""Bad input: each gets one clear error naming the file and the problem."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from helpers.tiny import make_gguf_model, make_hf_model
from specdec.model.errors import ModelFileError, SpecdecError
from specdec.model.load import load_model
from specdec.model.registry import MODELS, model_path, resolve


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


def _writer(path, arch="llama"):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
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


def test_unknown_quantization(tmp_path):
    path = tmp_path / "q.gguf"
    w = _writer(path)
    iq = gguf.GGMLQuantizationType.IQ4_NL  # 32 values in 18 bytes; not a type specdec loads
    w.add_tensor("token_embd.weight", np.zeros((8, 18), dtype=np.uint8), raw_dtype=iq)
    _finish(w)
    with pytest.raises(ModelFileError, match="token_embd.weight has quantization IQ4_NL"):
        _load(path)


def test_tensor_of_the_wrong_shape(tmp_path):
    path = make_gguf_model(tmp_path / "ok.gguf")
    reader = gguf.GGUFReader(path)
    bad = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(bad), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        array = np.array(t.data)
        if t.name == "blk.0.attn_q.weight":
            array = array[:-4]  # 4 rows short
        w.add_tensor(t.name, array)
    _finish(w)
    with pytest.raises(ModelFileError, match=r"blk\.0\.attn_q\.weight has shape \(60, 64\), expected \(64, 64\)"):
        _load(bad)


def test_wrong_sha256_refuses_to_load(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    path = model_path("smollm2-135m")
    path.parent.mkdir(parents=True)
    make_gguf_model(path)  # a valid GGUF, but not the file the checksum names
    with pytest.raises(SpecdecError, match="sha256 does not match the expected checksum for smollm2-135m"):
        resolve("smollm2-135m")
    assert MODELS["smollm2-135m"].sha256 != ""


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


def test_unknown_weight_format(tiny_hf_dir):
    with pytest.raises(ValueError, match="unknown weight format 'int3'"):
        load_model(str(tiny_hf_dir), "int3", progress=False)
