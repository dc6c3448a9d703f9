"""Reading and writing specdec's files.

Reading: a folder's JSON settings (config.json, tokenizer_config.json) and a safetensors file's header,
each failure a ModelFileError that names the file.

Writing a file so that a reader never sees half of it: into a temporary file beside it, then renamed over it.

    with replaced(folder / "model.safetensors") as tmp:
        save_file(tensors, str(tmp))

A run killed while it writes leaves the previous file whole (and a *.tmp beside it; one the write fails
in-process is removed). The caller creates the temporary file, so it gets the usual permissions (umask),
as the file written in place did.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

from safetensors import safe_open

from specdec.model.errors import ModelFileError


@contextmanager
def replaced(path):
    """Yields a temporary path (not yet created) in path's folder; when the block ends without an error,
    what was written there becomes path."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path, text: str) -> None:
    """path.write_text(text), atomically."""
    with replaced(path) as tmp:
        tmp.write_text(text)


def read_json_object(file: Path) -> dict:
    """A folder's JSON settings file (config.json, tokenizer_config.json) as a dict; a ModelFileError naming
    the file where it is not valid UTF-8 JSON or not an object."""
    try:
        raw = json.loads(Path(file).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(file, f"not valid JSON ({exc})") from None
    except OSError as exc:
        raise ModelFileError(file, f"cannot be read ({exc.strerror})") from None
    if not isinstance(raw, dict):
        raise ModelFileError(file, f"holds a JSON {type(raw).__name__}, not an object of settings")
    return raw


def safetensors_header(file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} of a safetensors file, read from its header (no tensor data); a
    ModelFileError where the file is truncated or damaged."""
    try:
        with safe_open(str(file), framework="pt") as f:
            return {name: (str(f.get_slice(name).get_dtype()), tuple(f.get_slice(name).get_shape()))
                    for name in f.keys()}
    except Exception as exc:  # safetensors' own error type
        raise ModelFileError(file, f"not a readable safetensors file ({exc})") from None


def safetensors_names(file: Path) -> list[str]:
    """The tensor names of a safetensors file; a ModelFileError where it is truncated or damaged."""
    return list(safetensors_header(file))


def out_dir(path, flag: str = "--out") -> Path:
    """The folder a command writes its results into, made now: a one-line error where it cannot be (a file
    of that name, no permission) before a model loads, not after a run of many minutes."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {path} is a file; give a folder to write into")
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
    return out
