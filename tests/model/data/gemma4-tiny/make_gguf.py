"""Writes this folder's GGUF files (f32.gguf, q8_0.gguf): llama.cpp's own convert_hf_to_gguf.py (architecture
gemma4) run on a copy of hf/ whose byte-level tokenizer is replaced by a Gemma-style one (tests/helpers/gemma4_gguf.py:
BPE over '▁' pieces with byte fallback), which the converter's gemma4 vocabulary reader requires. The weights are
hf/'s, so f32.gguf's logits are transformers' on hf/:

    python tests/model/data/gemma4-tiny/make_gguf.py      (llama.cpp's tree: scripts/llama_converter.sh, or
                                                           LLAMA_CPP_DIR)
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # tests/, for helpers

from helpers.gemma4_gguf import gemma_tokenizer  # noqa: E402
from helpers.llama_converter import convert_to_gguf  # noqa: E402

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "hf"
        shutil.copytree(HERE / "hf", folder)
        gemma_tokenizer(folder, json.loads((folder / "config.json").read_text())["vocab_size"])
        for outtype in ("f32", "q8_0"):
            convert_to_gguf(folder, HERE / f"{outtype}.gguf", outtype)
    print("wrote f32.gguf q8_0.gguf")
