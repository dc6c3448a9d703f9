"""Writes this folder's fixture: a tiny Qwen3.5 checkpoint written by transformers' own classes (folder hf/,
helpers/qwen35.transformers_folder, MTP layer included) and its conversions by llama.cpp's own
convert_hf_to_gguf.py (f32.gguf, q8_0.gguf). Needs llama.cpp's source tree:

    LLAMA_CPP_DIR=/path/to/llama.cpp python tests/model/data/qwen35-tiny/make_fixture.py
"""

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # tests/, for helpers

from helpers.qwen35 import convert_to_gguf, transformers_folder  # noqa: E402

if __name__ == "__main__":
    shutil.rmtree(HERE / "hf", ignore_errors=True)
    folder = transformers_folder(HERE / "hf", "text", seed=0)
    for outtype in ("f32", "q8_0"):
        convert_to_gguf(folder, HERE / f"{outtype}.gguf", outtype)
    print("wrote", *sorted(p.name for p in HERE.rglob("*") if p.is_file()))
