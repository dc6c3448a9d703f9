"""Writes this folder's fixture: llama.cpp's own convert_hf_to_gguf.py (architecture qwen3next) on a tiny Qwen3-Next
checkpoint that transformers' own classes wrote (helpers/qwen35moe.fixture_folder(..., "next"): seed 0, MTP layer
included, every weight a float16 value so that f16 holds them exactly) -> f16.gguf, q8_0.gguf. Needs llama.cpp's
source tree:

    LLAMA_CPP_DIR=/path/to/llama.cpp python tests/model/data/qwen3next-tiny/make_fixture.py
"""

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # tests/, for helpers

from helpers.qwen35moe import convert_to_gguf, fixture_folder  # noqa: E402

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        folder = fixture_folder(Path(tmp) / "hf", "next")
        for outtype in ("f16", "q8_0"):
            convert_to_gguf(folder, HERE / f"{outtype}.gguf", outtype)
    print("wrote", *sorted(f"{p.name} ({p.stat().st_size} bytes)" for p in HERE.glob("*.gguf")))
