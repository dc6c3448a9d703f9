"""Writes this folder's fixture: llama.cpp's own convert_hf_to_gguf.py (--outtype f16) on a tiny Qwen3-MoE and a
tiny GLM-4.5 (glm4_moe) checkpoint that transformers' own classes wrote (helpers/moe.fixture_folder: seed 0,
every weight a float16 value, so f16 holds them exactly) -> qwen3_moe.gguf, glm4_moe.gguf, and the GLM-4.5 with
its nextn (MTP) layer, glm4_moe_mtp.gguf (helpers/moe.mtp_folder). Needs llama.cpp's
source tree:

    LLAMA_CPP_DIR=/path/to/llama.cpp python tests/model/data/moe-tiny/make_fixture.py
"""

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # tests/, for helpers

from helpers.moe import FAMILIES, convert_to_gguf, fixture_folder  # noqa: E402

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for family in (*FAMILIES, "glm4_moe_mtp"):
            convert_to_gguf(fixture_folder(Path(tmp) / family, family), HERE / f"{family}.gguf", "f16")
    print("wrote", *sorted(f"{p.name} ({p.stat().st_size} bytes)" for p in HERE.glob("*.gguf")))
