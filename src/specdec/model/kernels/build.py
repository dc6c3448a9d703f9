"""Compiling the C kernels into shared libraries, once per digest of their sources, flags and compiler.

A library is compiled with the system C compiler (`cc`, or $CC, which may hold arguments) from its SOURCES
into $SPECDEC_HOME/kernels/ (where that cannot be written, a folder of this user's own in the temporary
directory), named `<library>-<digest>.so`, and loaded with ctypes: no torch headers, about a second to build;
a file there that does not load is rebuilt once. Where the CPU has AVX512-VNNI (with VL), gguf and w8a8 are
built with VNNI_FLAGS: their integer dot products then take one vpdpbusd instead of maddubs + madd, the same
integers exactly, so the same bits as the AVX2 build (SPECDEC_KERNEL_AVX2=1 keeps the AVX2 build). attend is
built with the same flags there and runs its q . k and p . v in zmm registers, each sum the same chain of
fmas, so again the AVX2 build's bits. A library that cannot be built leaves its reason in `why_unavailable`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from specdec.model.kernels.cpu import cpu_flags
from specdec.model.catalogue import specdec_home

FOLDER = Path(__file__).parent
# library -> its files: the .c sources compiled into it and the headers they include (all in its digest)
SOURCES = {
    "w8a8": ("w8a8.c",),
    "attend": ("attend.c",),
    "gguf": ("gguf_blocks.h", "gguf_acts.c", "gguf_linear.c", "gguf_repack.c", "gguf_values.c"),
    "rows": ("rows.c",),
    "step": ("step.c",),
    "deltanet": ("deltanet.c",),
    "moe": ("moe.c",),
}
# -ffp-contract=off: no mul and add fused unless the source asks (the bits are the source's arithmetic)
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
VNNI_FLAGS = ("-mavx512vnni", "-mavx512vl")  # 256-bit vpdpbusd (EVEX); AMD Zen 4, Intel Ice Lake and later

reasons: dict[str, str] = {}  # library -> why it did not load


def why_unavailable(kernel: str = "w8a8") -> str | None:
    """Why a library did not load (`kernels.w8a8()`, `kernels.attend()`... returned None); None when it loaded."""
    return reasons.get(kernel)


def library(kernel: str, extra: tuple[str, ...] = ()):
    """The library `kernel` compiled from its SOURCES with FLAGS + extra (once per digest) and loaded, or None
    with the reason kept."""
    missing = {"avx2", "fma", "f16c"} - cpu_flags()
    if missing:
        reasons[kernel] = f"this CPU lacks {', '.join(sorted(missing))}"
        return None
    compiler = shlex.split(os.environ.get("CC") or "") or [shutil.which("cc") or shutil.which("gcc")]  # "ccache gcc"
    if compiler[0] is None:
        reasons[kernel] = "no C compiler (cc) found; install gcc"
        return None
    flags = (*FLAGS, *extra)
    files = [FOLDER / name for name in SOURCES[kernel]]
    sources = [str(path) for path in files if path.suffix == ".c"]
    code = b"".join(path.read_bytes() for path in files)
    digest = hashlib.sha256(code + " ".join((*compiler, *flags)).encode()).hexdigest()[:16]
    why = None
    for folder in _kernel_folders():
        lib, why, fatal = _build_in(folder / f"{kernel}-{digest}.so", [*compiler, *flags, *sources], kernel)
        if lib is not None:
            return lib
        if fatal:  # the compiler's own error: another folder would not help
            break
    reasons[kernel] = why
    return None


def _kernel_folders():
    """Where built kernels are kept: $SPECDEC_HOME/kernels, then (when that one cannot be written, a read-only
    home) a folder in the temporary directory that belongs to this user alone (another user's, or one others
    can write, could hold a library that is not ours)."""
    yield specdec_home() / "kernels"
    own = Path(tempfile.gettempdir()) / f"specdec-kernels-{os.getuid()}"
    try:
        own.mkdir(mode=0o700, exist_ok=True)
        st = own.lstat()
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
        yield own


def _build_in(target: Path, command: list[str], kernel: str):
    """(the library at target, None, False), built first where it is missing or does not load (an empty file
    a crash left: rebuilt once); else (None, why, whether the compiler itself failed)."""
    why = None
    for attempt in range(2):
        try:
            if attempt or not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                    built = Path(tmp) / target.name
                    subprocess.run([*command, "-o", str(built), "-lm"], check=True, capture_output=True, text=True,
                                   timeout=120)
                    os.replace(built, target)  # atomic: a concurrent build leaves one whole file
            return ctypes.CDLL(str(target)), None, False
        except subprocess.CalledProcessError as exc:
            return None, f"building {kernel} failed: {(exc.stderr or str(exc)).strip()[:300]}", True
        except (OSError, subprocess.SubprocessError) as exc:  # unwritable, unreadable, or a library that won't load
            why = f"building {kernel} in {target.parent} failed: {str(exc).strip()[:300]}"
    return None, why, False
