"""llama.cpp's own convert_hf_to_gguf.py, run on a folder transformers wrote: GGUF files in llama.cpp's names,
not ours (the MoE and Qwen3.5 fixtures; tests/model/data/*/make_fixture.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

NO_TREE = "no llama.cpp source tree here"  # the skip reason (tests/conftest.py MACHINE_SKIPS) without one

# The converter asks the tokenizer's pre-tokenizer by hash; the tiny tokenizers have none it knows, so the
# default pre-tokenizer is named. `prelude` adds a family's own lines before the script runs.
_CONVERT = """import runpy, sys
sys.path.insert(0, sys.argv[1])
{prelude}
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
script = sys.argv[1] + "/convert_hf_to_gguf.py"
sys.argv = [script, *sys.argv[2:]]
runpy.run_path(script, run_name="__main__")
"""


def llama_cpp_tree() -> Path | None:
    """llama.cpp's source tree (its convert_hf_to_gguf.py): $LLAMA_CPP_DIR, two levels above $LLAMA_CPP_BIN
    (a build/bin folder), or where scripts/llama_converter.sh puts it; None where none holds one."""
    candidates = [os.environ.get("LLAMA_CPP_DIR", "")]
    if os.environ.get("LLAMA_CPP_BIN"):
        candidates.append(str(Path(os.environ["LLAMA_CPP_BIN"]).resolve().parent.parent))
    home = Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec")
    candidates.append(str(home / "llama.cpp" / "llama-cpp-python-0.3.36"))
    return next((Path(c) for c in candidates if c and (Path(c) / "convert_hf_to_gguf.py").is_file()), None)


def convert_to_gguf(folder, out, outtype: str, tree: Path | None = None, prelude: str = "") -> Path:
    """llama.cpp's converter on `folder` -> the GGUF file `out` (outtype f16, f32, q8_0, ...)."""
    tree = tree or llama_cpp_tree()
    if tree is None:
        raise FileNotFoundError(NO_TREE)
    done = subprocess.run([sys.executable, "-c", _CONVERT.format(prelude=prelude), str(tree), str(folder),
                           "--outfile", str(out), "--outtype", outtype], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed: {done.stderr[-2000:]}")
    return Path(out)
