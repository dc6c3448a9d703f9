"""The converted-weights cache: a built Transformer's tensors, saved once, memory-mapped at later starts.

Building a Transformer dequantizes every GGUF tensor and requantizes it to the in-memory format
(model/linear.py): ~75 s for qwen2.5-coder-1.5b. The result depends only on the checkpoint's
bytes, the weight format, the model config and the conversion code, so it is saved as

    $SPECDEC_HOME/converted/<sha256>-<format>-v<CONVERSION_VERSION>.safetensors

a plain safetensors file (never pickle) whose header metadata holds the manifest: the checkpoint's
sha256, the format, CONVERSION_VERSION, the torch and gguf versions, every compared field of the
ModelConfig, the tensor order, and a CRC-32 of all tensor bytes. A later start maps the file and puts
the Transformer together from it (build.transformer_from_tensors): bitwise the same tensors, so
bitwise the same logits. A file that fails any check (unreadable, truncated, another key, wrong
dtypes or shapes, a missing or extra tensor, a CRC mismatch) is rebuilt and replaced, never used.
Files are written to a temporary name and renamed, so a reader never sees half a file; a cache that
cannot be written is reported once on stderr and loading goes on. HF folders use the same cache,
keyed by load.py's folder digest (config.json and every *.safetensors file).

Tensor data is aligned to 64 bytes in the file (the header is padded with spaces, as safetensors
allows): MKL's fp32 kernels give other bits for a weight that is only 8-byte aligned.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import zlib
from dataclasses import fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from safetensors import safe_open

from specdec.model.build import build_transformer, transformer_from_tensors, transformer_tensors
from specdec.model.catalogue import specdec_home
from specdec.model.config import ModelConfig
from specdec.model.files import replaced
from specdec.model.kernels import env_flag
from specdec.model.transformer import Transformer

# Bump whenever the conversion changes what it produces (model/build.py, model/linear.py, the loaders'
# dequantization or renaming): files of other versions are then rebuilt.
CONVERSION_VERSION = 2  # 2: int8 widths not a multiple of 16 are stored as bf16
DISABLE_ENV = "SPECDEC_NO_WEIGHT_CACHE"
# Models this small convert in well under a second; caching them would only fill the disk (and the
# tests' toy models would pile up in the user's cache).
MIN_PARAMS = 10_000_000
ALIGN = 64
_MANIFEST_KEY = "specdec.converted_weights"
_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int8: "I8",
           torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64"}
_warned_unwritable = False


def cache_file(sha256: str, weights_format: str) -> Path:
    return specdec_home() / "converted" / f"{sha256}-{weights_format}-v{CONVERSION_VERSION}.safetensors"


def worth_caching(params: int, requested: bool = True) -> bool:
    """Whether load_model should go through the cache: asked for, not turned off by SPECDEC_NO_WEIGHT_CACHE=1,
    and a model big enough for conversion to take a while."""
    return requested and not env_flag(DISABLE_ENV) and params >= MIN_PARAMS


def load_or_build(source, sha256: str, weights_format: str, progress=None) -> Transformer:
    """build_transformer(source, weights_format), read from the cache when a valid file is there, and
    saved to it when not. sha256: the checkpoint's digest (file, or folder digest for HF folders)."""
    path = cache_file(sha256, weights_format)
    manifest = _manifest(sha256, weights_format, source.config)
    try:
        present = path.is_file()
    except OSError as exc:  # a converted/ folder that cannot be searched (Path.is_file raises PermissionError)
        present, problem = False, f"{type(exc).__name__}: {exc}"
        print(f"specdec: the converted-weights cache {path} cannot be read ({problem}); converting", file=sys.stderr)
    if present:
        transformer, problem = _read(path, manifest, source.config, weights_format)
        if transformer is not None:
            return transformer
        print(f"specdec: the converted-weights cache {path} is unusable ({problem}); converting again",
              file=sys.stderr)
    transformer = build_transformer(source, weights_format, progress=progress)
    if _write(path, transformer_tensors(transformer), manifest):
        _tidy(path.parent, f"{sha256}-{weights_format}-v", keep=path)
    return transformer


def _tidy(folder: Path, prefix: str, keep: Path) -> None:
    """Remove the same checkpoint and format under other conversion versions, and temporary files that
    a killed writer left (untouched for an hour, so never one being written now)."""
    hour_ago = time.time() - 3600
    for f in [*folder.glob(prefix + "*.safetensors"), *folder.glob("*.tmp")]:
        try:  # another process's temporary file can be renamed away between the listing and here
            if f != keep and (f.suffix != ".tmp" or f.stat().st_mtime < hour_ago):
                f.unlink()
        except OSError:
            pass


def _manifest(sha256: str, weights_format: str, config: ModelConfig) -> dict:
    """Everything the converted tensors depend on; a file whose manifest differs is stale."""
    settings = {f.name: getattr(config, f.name) for f in fields(config) if f.compare}
    return {
        "conversion_version": CONVERSION_VERSION,
        "source_sha256": sha256,
        "weights_format": weights_format,
        "torch": torch.__version__,  # int4's packed layout is torch's own
        "gguf": _version("gguf"),  # GGUF dequantization is the gguf package's
        "config": json.loads(json.dumps(settings, default=str)),  # tuples become lists, as read back
    }


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _read(path: Path, expected: dict, config: ModelConfig, weights_format: str) -> tuple[Transformer | None, str]:
    """(the Transformer, "") from a valid cache file, or (None, what is wrong with it)."""
    try:
        with safe_open(path, framework="pt") as f:
            stored = json.loads((f.metadata() or {}).get(_MANIFEST_KEY, "null"))
            if not isinstance(stored, dict):
                return None, "no manifest"
            for key, value in expected.items():
                if stored.get(key) != value:
                    return None, f"stale: {key} is {_short(stored.get(key))}, expected {_short(value)}"
            order, aliases = list(stored["order"]), dict(stored["aliases"])
            if sorted(order) != sorted(f.keys()):
                return None, "the tensors differ from the manifest's list"
            tensors = {name: f.get_tensor(name) for name in order}
    except Exception as exc:  # safetensors raises its own error types for bad headers and short files
        return None, f"unreadable: {type(exc).__name__}: {exc}"
    crc = 0
    for name in order:
        crc = zlib.crc32(_bytes(tensors[name]), crc)
    if crc != stored.get("crc32"):
        return None, "corrupt: CRC-32 mismatch"
    for name in order:
        if tensors[name].data_ptr() % ALIGN:  # another writer's layout; keep the numerics of aligned memory
            tensors[name] = tensors[name].clone()
    try:
        tensors.update({alias: tensors[target] for alias, target in aliases.items()})
        return transformer_from_tensors(config, weights_format, tensors), ""
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"does not fit the model: {exc}"


def _write(path: Path, tensors: dict[str, torch.Tensor], manifest: dict) -> bool:
    """Save atomically (temporary file, then rename); on failure warn once per process and carry on."""
    global _warned_unwritable
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        needed = sum(_nbytes(t) for t in {id(t): t for t in tensors.values()}.values())
        free = shutil.disk_usage(path.parent).free
        if free < needed + (1 << 30):
            raise OSError(f"{needed / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free: keeping 1 GB spare")
        # created by open(), so with the umask's permissions (mkstemp's 0600 kept the other users of a shared
        # home converting again, each replacing the file with one only it could read)
        with replaced(path) as tmp, open(tmp, "wb") as out:
            _write_safetensors(out, tensors, manifest)
        return True
    except OSError as exc:
        if not _warned_unwritable:
            _warned_unwritable = True
            print(f"specdec: cannot write the converted-weights cache in {path.parent} ({exc}); the next start "
                  f"will convert the weights again (set {DISABLE_ENV}=1 to skip the cache)", file=sys.stderr)
        return False


def _write_safetensors(out, tensors: dict[str, torch.Tensor], manifest: dict) -> None:
    """A safetensors file, each tensor's data at a multiple of ALIGN bytes where sizes allow.

    Tensors held under two names are stored once and listed in the manifest's "aliases"."""
    unique, aliases, first_name = {}, {}, {}
    for name in sorted(tensors):
        t = tensors[name]
        if id(t) in first_name:
            aliases[name] = first_name[id(t)]
        else:
            first_name[id(t)] = name
            unique[name] = t
    # whole multiples of ALIGN first, so each of those starts aligned; then the rest, widest dtype first
    order = sorted(unique, key=lambda n: (_nbytes(unique[n]) % ALIGN != 0, -unique[n].element_size(), n))
    header, offset, crc = {}, 0, 0
    for name in order:
        t = unique[name]
        end = offset + _nbytes(t)
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, end]}
        offset = end
        crc = zlib.crc32(_bytes(t), crc)
    stored = dict(manifest, order=order, aliases=aliases, crc32=crc)
    header["__metadata__"] = {_MANIFEST_KEY: json.dumps(stored)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)
    out.write(len(text).to_bytes(8, "little"))
    out.write(text)
    for name in order:
        out.write(_bytes(unique[name]))


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy (for the CRC and for writing)."""
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())
