"""Writing a file so that a reader never sees half of it: into a temporary file beside it, then renamed over it.

    with replaced(folder / "model.safetensors") as tmp:
        save_file(tensors, str(tmp))

A run killed while it writes leaves the previous file whole (and a *.tmp beside it; one the write fails
in-process is removed). The caller creates the temporary file, so it gets the usual permissions (umask),
as the file written in place did.
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path


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
