"""The converted-weights cache (model/weight_cache.py): a cached start is bitwise a cold start, and a
bad cache file (corrupt, truncated, stale, another model's, the wrong tensors) is rebuilt, never used."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import specdec.model.weight_cache as wc
from helpers.tiny import make_gguf_model, make_hf_model
from specdec.model import kernels
from specdec.model.linear import CONVERTED_FORMATS, QLinear
from specdec.model.load import load_model

FORMATS = [pytest.param(f, marks=pytest.mark.skipif(f == "w8a8" and kernels.w8a8() is None,
                                                    reason="no W8A8 kernel here")) for f in CONVERTED_FORMATS]
TOKENS = torch.tensor([[5, 9, 77, 100, 3, 250]])


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A private SPECDEC_HOME (the user's cache is never touched), and the toy models cached too."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(wc.DISABLE_ENV, raising=False)
    monkeypatch.setattr(wc, "MIN_PARAMS", 0)
    monkeypatch.setattr(wc, "_warned_unwritable", False)
    return tmp_path / "home"


def _source(tmp_path, kind: str):
    if kind == "gguf":
        return make_gguf_model(tmp_path / "m.gguf")
    if kind == "hf-qwen2":
        return make_hf_model(tmp_path / "qwen2", arch="qwen2", seed=1)
    return make_hf_model(tmp_path / "qwen3", arch="qwen3", seed=2, extra_config={"tie_word_embeddings": True})


def _logits(model) -> torch.Tensor:
    tr = model.transformer
    return tr.forward(TOKENS, tr.new_cache(32), [0]).logits  # (1, T, V)


def _load(path, fmt="int8", **kw):
    return load_model(str(path), fmt, progress=False, **kw)


def _no_conversion(monkeypatch):
    """From here on, converting weights fails the test: a load must come from the cache."""
    def convert(*args, **kwargs):
        raise AssertionError("the weights were converted again instead of read from the cache")

    monkeypatch.setattr(wc, "build_transformer", convert)


def _cache_files(home):
    return sorted((home / "converted").glob("*.safetensors"))


@pytest.mark.parametrize("kind", ["gguf", "hf-qwen2", "hf-qwen3-tied"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_cached_start_gives_bitwise_the_logits_of_a_cold_start(tmp_path, home, monkeypatch, kind, fmt):
    src = _source(tmp_path, kind)
    cold = _logits(_load(src, fmt, weight_cache=False))
    assert _cache_files(home) == []  # weight_cache=False neither reads nor writes
    first = _load(src, fmt)  # converts and writes
    (written,) = _cache_files(home)
    assert written.name == f"{first.info.sha256}-{fmt}-v{wc.CONVERSION_VERSION}.safetensors"
    _no_conversion(monkeypatch)
    warm = _load(src, fmt)
    assert torch.equal(_logits(first), cold)
    assert torch.equal(_logits(warm), cold)
    assert warm.info == first.info


def test_the_file_is_plain_safetensors_with_aligned_tensors(tmp_path, home):
    from safetensors import safe_open

    model = _load(_source(tmp_path, "gguf"), "int4")
    (path,) = _cache_files(home)
    with safe_open(path, framework="pt") as f:  # safetensors' own reader accepts it
        manifest = json.loads(f.metadata()[wc._MANIFEST_KEY])
        stored = {name: f.get_tensor(name) for name in f.keys()}
    assert manifest["source_sha256"] == model.info.sha256 and manifest["weights_format"] == "int4"
    assert torch.equal(stored["lm_head.weight"], model.transformer.lm_head.weight)
    assert torch.equal(stored["layers.1.qkv.scale_zero"], model.transformer.layers[1].qkv.scale_zero)
    assert all(t.data_ptr() % wc.ALIGN == 0 for t in stored.values())


def test_fp32_tied_embedding_is_stored_once_and_shared_again(tmp_path, home, monkeypatch):
    src = _source(tmp_path, "hf-qwen3-tied")
    _load(src, "fp32")
    _no_conversion(monkeypatch)
    warm = _load(src, "fp32")
    assert warm.transformer.lm_head.weight is warm.transformer.embed
    (path,) = _cache_files(home)
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert "lm_head.weight" not in header
    assert json.loads(header["__metadata__"][wc._MANIFEST_KEY])["aliases"] == {"lm_head.weight": "embed"}


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    data[offset + 1] ^= 0xFF
    path.write_bytes(bytes(data))


def _data_start(path) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


BREAKAGES = {
    "a flipped byte in the tensor data": lambda p: _flip(p, (_data_start(p) + p.stat().st_size) // 2),
    "a flipped byte in the last tensor": lambda p: _flip(p, p.stat().st_size - 3),
    "a flipped byte in the header": lambda p: _flip(p, 40),
    "a truncated file": lambda p: p.write_bytes(p.read_bytes()[:-100]),
    "only the header left": lambda p: p.write_bytes(p.read_bytes()[: _data_start(p)]),
    "an empty file": lambda p: p.write_bytes(b""),
    "not a safetensors file": lambda p: p.write_bytes(b"\x80\x04 a pickle, never unpickled" * 10),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_cache_file_is_rebuilt_never_used(tmp_path, home, monkeypatch, capsys, breakage):
    src = _source(tmp_path, "gguf")
    cold = _logits(_load(src, weight_cache=False))
    _load(src)
    (path,) = _cache_files(home)
    BREAKAGES[breakage](path)
    rebuilt = _load(src)
    assert "converted-weights cache" in capsys.readouterr().err
    assert torch.equal(_logits(rebuilt), cold)
    _no_conversion(monkeypatch)  # the rebuilt file is valid: the next start reads it
    assert torch.equal(_logits(_load(src)), cold)
    assert _cache_files(home) == [path]


def test_a_stale_conversion_version_is_rebuilt_and_removed(tmp_path, home, monkeypatch, capsys):
    src = _source(tmp_path, "gguf")
    cold = _logits(_load(src, weight_cache=False))
    _load(src)
    (old,) = _cache_files(home)
    was = wc.CONVERSION_VERSION
    monkeypatch.setattr(wc, "CONVERSION_VERSION", was + 1)
    new = old.with_name(old.name.replace(f"-v{was}.", f"-v{was + 1}."))
    new.write_bytes(old.read_bytes())  # an old file under the new name: its manifest still says the old one
    assert torch.equal(_logits(_load(src)), cold)
    assert f"stale: conversion_version is {was}, expected {was + 1}" in capsys.readouterr().err
    assert _cache_files(home) == [new]  # rebuilt under the new version; the old file is gone
    _no_conversion(monkeypatch)
    assert torch.equal(_logits(_load(src)), cold)


def test_another_models_file_is_not_used(tmp_path, home, monkeypatch, capsys):
    a = make_gguf_model(tmp_path / "a.gguf", seed=1)
    b = make_gguf_model(tmp_path / "b.gguf", seed=2)
    cold_b = _logits(_load(b, weight_cache=False))
    model_a = _load(a)
    sha_b = _load(b, weight_cache=False).info.sha256
    (file_a,) = _cache_files(home)
    file_b = file_a.with_name(file_a.name.replace(model_a.info.sha256, sha_b))
    file_b.write_bytes(file_a.read_bytes())  # a's converted weights under b's name
    assert torch.equal(_logits(_load(b)), cold_b)
    assert "stale: source_sha256" in capsys.readouterr().err
    _no_conversion(monkeypatch)
    assert torch.equal(_logits(_load(b)), cold_b)


def test_a_rewritten_checkpoint_is_not_served_its_old_weights(tmp_path, home):
    """The digest book is keyed by path, size and mtime in ns: a same-size rewrite is hashed again."""
    path = tmp_path / "m.gguf"
    make_gguf_model(path, seed=1)
    _load(path)
    make_gguf_model(path, seed=2)  # same size, same second
    expected = _logits(_load(path, weight_cache=False))
    assert torch.equal(_logits(_load(path)), expected)


def _rewrite(path, change=lambda tensors: None, change_manifest=lambda manifest: None):
    """Rewrite a cache file with its tensors or manifest changed, and a CRC that agrees with them."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        manifest = json.loads(f.metadata()[wc._MANIFEST_KEY])
        tensors = {name: f.get_tensor(name).clone() for name in f.keys()}
    change(tensors)
    for key in ("order", "aliases", "crc32"):
        del manifest[key]
    change_manifest(manifest)
    with open(path, "wb") as out:
        wc._write_safetensors(out, tensors, manifest)


WRONG_TENSORS = {
    "a missing tensor": lambda t: t.pop("layers.0.o.weight"),
    "a missing scale": lambda t: t.pop("lm_head.scale"),
    "an extra tensor": lambda t: t.update(extra=torch.zeros(4)),
    "another dtype": lambda t: t.update(norm=t["norm"].to(torch.bfloat16)),
    "another shape": lambda t: t.update({"layers.1.down.weight": t["layers.1.down.weight"].reshape(-1, 32)}),
    "a transposed matrix": lambda t: t.update({"layers.0.gate_up.weight": t["layers.0.gate_up.weight"].T.contiguous()}),
}


@pytest.mark.parametrize("wrong", list(WRONG_TENSORS))
def test_wrong_tensors_with_a_valid_checksum_are_rebuilt(tmp_path, home, monkeypatch, capsys, wrong):
    src = _source(tmp_path, "gguf")
    cold = _logits(_load(src, weight_cache=False))
    _load(src)
    (path,) = _cache_files(home)
    _rewrite(path, WRONG_TENSORS[wrong])
    assert torch.equal(_logits(_load(src)), cold)
    assert "does not fit the model" in capsys.readouterr().err
    _no_conversion(monkeypatch)
    assert torch.equal(_logits(_load(src)), cold)


STALE_KEYS = {
    "conversion_version": 0,
    "source_sha256": "0" * 64,
    "weights_format": "bf16",
    "torch": "2.0.0",
    "gguf": "0.1.0",
    "config": {"arch": "llama"},
}


@pytest.mark.parametrize("key", list(STALE_KEYS))
def test_each_part_of_the_key_is_checked(tmp_path, home, monkeypatch, capsys, key):
    src = _source(tmp_path, "gguf")
    cold = _logits(_load(src, weight_cache=False))
    _load(src)
    (path,) = _cache_files(home)
    _rewrite(path, change_manifest=lambda manifest: manifest.update({key: STALE_KEYS[key]}))
    assert torch.equal(_logits(_load(src)), cold)
    assert f"stale: {key} is" in capsys.readouterr().err
    _no_conversion(monkeypatch)
    assert torch.equal(_logits(_load(src)), cold)


def test_rewrite_helper_keeps_a_valid_file_valid(tmp_path, home, monkeypatch):
    """The wrong-tensor tests above fail because of the change, not because _rewrite breaks files."""
    src = _source(tmp_path, "gguf")
    cold = _logits(_load(src, weight_cache=False))
    _load(src)
    _rewrite(_cache_files(home)[0])
    _no_conversion(monkeypatch)
    assert torch.equal(_logits(_load(src)), cold)


def test_an_unwritable_cache_still_loads_and_warns_once(tmp_path, home, capsys):
    src = _source(tmp_path, "gguf")
    cold = _logits(_load(src, weight_cache=False))
    home.mkdir(parents=True, exist_ok=True)
    (home / "converted").write_text("a file where the cache folder should be")
    assert torch.equal(_logits(_load(src)), cold)
    assert torch.equal(_logits(_load(src, "bf16")), _logits(_load(src, "bf16", weight_cache=False)))
    err = capsys.readouterr().err
    assert err.count("cannot write the converted-weights cache") == 1
    assert not list(home.glob("**/*.tmp"))


NOBODY = 65534  # the uid a root test runs the load under


@contextlib.contextmanager
def _effective_uid(uid: int):
    """The block runs with this effective uid (Linux checks file access by the filesystem uid, which follows
    it, in every thread), and root's after."""
    before = os.geteuid()
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(before)


def test_a_read_only_cache_folder_still_loads(tmp_path, monkeypatch, capsys):
    """A converted/ folder its owner may search but not write: the model loads, converted, with a warning.
    Mode bits do not stop root (this test skipped as root), so as root the cached load runs with the effective
    uid of nobody, the folder's owner: the kernel refuses the write as it refuses any user's. tmp_path's parents
    are root's and 0700, so that run works in a folder of the temporary directory that nobody can reach."""
    root = os.geteuid() == 0
    work = Path(tempfile.mkdtemp(prefix="specdec-read-only-")) if root else tmp_path
    user = NOBODY if root else os.geteuid()
    home = work / "home"
    try:
        work.chmod(0o755)
        src = _source(work, "gguf")
        cold = _logits(_load(src, weight_cache=False))  # the kernels are built (and kept) before the uid changes
        monkeypatch.setenv("SPECDEC_HOME", str(home))
        (home / "converted").mkdir(parents=True)
        for folder in (home, home / "converted"):
            os.chown(folder, user, -1)
        (home / "converted").chmod(0o500)
        with _effective_uid(user):
            assert torch.equal(_logits(_load(src)), cold)
        (home / "converted").chmod(0o700)
        assert _cache_files(home) == []
    finally:
        if root:
            shutil.rmtree(work)
    err = capsys.readouterr().err
    assert "cannot write the converted-weights cache" in err and "Permission denied" in err  # open() refused


def test_the_opt_outs_write_nothing(tmp_path, home, monkeypatch):
    src = _source(tmp_path, "gguf")
    _load(src, weight_cache=False)
    monkeypatch.setenv(wc.DISABLE_ENV, "1")
    _load(src)
    assert _cache_files(home) == []
    monkeypatch.setattr(wc, "MIN_PARAMS", 10_000_000)  # the default: toy models are not worth a file
    monkeypatch.delenv(wc.DISABLE_ENV)
    _load(src)
    assert _cache_files(home) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_qlinear_from_its_tensors_computes_the_same(fmt):
    g = torch.Generator().manual_seed(0)
    # k = 80: int4 and w8a8 fall back to int8; k = 72: int8 (and so int4, w8a8) falls back to bf16;
    # n = 8: int4 (whose packing takes blocks of 16 rows) falls back to int8
    for n, k in ((48, 64), (40, 80), (40, 72), (8, 64)):
        q = QLinear(torch.randn(n, k, generator=g), torch.randn(n, generator=g), fmt)
        again = QLinear.from_tensors(q.tensors(), fmt, n, k)
        x = torch.randn(3, k, generator=g)
        assert again.fmt == q.fmt and torch.equal(again(x), q(x))
        if (n, k) == (8, 64):
            assert q.fmt == {"int4": "int8"}.get(fmt, fmt)
        with pytest.raises(ValueError):
            QLinear.from_tensors({**q.tensors(), "weight": q.weight[:-1]}, fmt, n, k)


def test_a_rebuild_removes_what_killed_writers_left(tmp_path, home):
    src = _source(tmp_path, "gguf")
    folder = home / "converted"
    folder.mkdir(parents=True)
    old, fresh = folder / "x.safetensors.abc.tmp", folder / "y.safetensors.def.tmp"
    old.write_bytes(b"half a file")
    fresh.write_bytes(b"being written by another process")
    os.utime(old, (old.stat().st_atime - 7200, old.stat().st_mtime - 7200))
    _load(src)
    assert not old.exists() and fresh.exists()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_widths_torchs_int8_kernel_cannot_take_fall_back_to_bf16(fmt):
    """torch 2.13's int8 weight-only kernel gives garbage (or crashes) when in_features % 16 != 0."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 72, generator=g)
    q = QLinear(w, None, fmt)
    x = torch.randn(5, 72, generator=g)
    assert q.fmt == "bf16"
    assert torch.allclose(q(x), x @ w.t(), atol=0.1, rtol=0.02)


def test_cache_files_get_the_umask_permissions(tmp_path, home):
    """mkstemp's 0600: another user of a shared SPECDEC_HOME could not read the file, converted again and
    replaced it with a copy only they could read."""
    _load(_source(tmp_path, "gguf"))
    [cached] = _cache_files(home)
    umask = os.umask(0)
    os.umask(umask)
    assert cached.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_cache_folder_that_cannot_be_searched_converts(tmp_path, home, monkeypatch, capsys):
    """Path.exists raised PermissionError out of load_model (a converted/ folder of mode 000, not root)."""
    from pathlib import Path

    src = _source(tmp_path, "gguf")
    expected = _logits(_load(src, weight_cache=False))
    real = Path.is_file

    def unsearchable(self):
        if self.parent.name == "converted":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "is_file", unsearchable)
    assert torch.equal(_logits(_load(src)), expected)
    assert "cannot be read (PermissionError" in capsys.readouterr().err


def test_tidying_skips_what_vanishes_meanwhile(tmp_path, home):
    """Another process's temporary file renamed away between the listing and its stat() crashed the start
    that had just converted (a dangling link stands for it here: listed, then no file to stat)."""
    folder = home / "converted"
    folder.mkdir(parents=True)
    (folder / "gone.safetensors.abc.tmp").symlink_to(folder / "nothing")
    _load(_source(tmp_path, "gguf"))
    assert len(_cache_files(home)) == 1


def test_a_gguf_file_that_cannot_run_its_own_blocks_says_why(tmp_path, monkeypatch, capsys):
    """Without the GGUF kernel a GGUF file runs in int8 by default: said once at load, with the reason
    (it was silent, so a read-only home or a bad $CC halved decode speed unnoticed)."""
    src = _source(tmp_path, "gguf")
    monkeypatch.setattr(kernels, "gguf", lambda: None)
    monkeypatch.setattr(kernels, "why_unavailable", lambda kernel="w8a8": "no C compiler (cc) found; install gcc")
    model = load_model(str(src), progress=True)
    assert model.info.weights_dtype == "int8"
    assert "runs in int8, not its own blocks: specdec's GGUF kernel is unavailable here (no C compiler" \
        in capsys.readouterr().err
