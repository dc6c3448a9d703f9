"""Writing a file so that a reader never sees half of it: into a temporary file beside it, then renamed over it.

    with replaced(folder / "model.safetensors") as tmp:
        save_file(tensors, str(tmp))

A run killed while it writes leaves the previous file whole (and a *.tmp beside it, removed when the
write fails in-process).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced(path):
    """Yields a temporary path in path's folder; when the block ends without an error, it becomes path."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None:
            os.unlink(tmp)


def write_text(path, text: str) -> None:
    """path.write_text(text), atomically."""
    with replaced(path) as tmp:
        tmp.write_text(text)
