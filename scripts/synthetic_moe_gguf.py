"""A synthetic Qwen3-MoE GGUF file in llama.cpp's names (qwen3moe: ffn_gate_inp, ffn_{gate,up,down}_exps, ...), random
Q8_0 weights, large enough to be memory-bound: the default is ~0.95B parameters in all, ~0.19B read per token
(16 layers of 32 experts of width 512, 4 chosen per token, hidden 1024, smollm2-135m's vocabulary of 49152).
The tokenizer is copied from a GGUF file given with --tokenizer-from (smollm2-135m's, after `specdec pull`).

    python scripts/synthetic_moe_gguf.py --out /tmp/moe-1b.gguf \
        --tokenizer-from ~/.cache/specdec/models/smollm2-135m/*.gguf

Nothing here is trained: it measures decode speed beside llama.cpp on the same file (scripts/moe_speed.py) and
checks that both runtimes compute the same mixture (their top-1 tokens), never text quality.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf  # llama.cpp's gguf-py (the gguf package)
import numpy as np
from gguf import GGUFReader, GGUFValueType

Q8_BLOCK = 32  # weights per Q8_0 block: a float16 scale, then 32 int8


def q8_rows(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    """Random Q8_0 blocks of a (..., cols) matrix as bytes (..., cols / 32 * 34): weights ~ uniform, std `std`."""
    *lead, cols = shape
    blocks = int(np.prod(lead)) * (cols // Q8_BLOCK)
    scale = np.full((blocks, 1), std / 73.0, dtype=np.float16).view(np.uint8)  # uniform int8's std is ~73
    quants = rng.integers(-127, 128, size=(blocks, Q8_BLOCK), dtype=np.int8).view(np.uint8)
    return np.concatenate([scale, quants], axis=1).reshape(*lead, cols // Q8_BLOCK * 34)


def copy_tokenizer(writer, path: Path) -> int:
    """The tokenizer.* keys of another GGUF file; returns its vocabulary size."""
    reader = GGUFReader(str(path))
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub)
        if name == "tokenizer.ggml.tokens":
            vocab = len(value)
    return vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokenizer-from", required=True, type=Path)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--experts-used", type=int, default=4)
    ap.add_argument("--expert-width", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    H, L, E, I, hd = a.hidden, a.layers, a.experts, a.expert_width, a.hidden // a.heads
    rng = np.random.default_rng(a.seed)
    arch = "qwen3moe"
    w = gguf.GGUFWriter(str(a.out), arch, use_temp_file=True)
    w.add_name("synthetic-moe")
    V = copy_tokenizer(w, a.tokenizer_from)
    for key, value in (("block_count", L), ("context_length", 4096), ("embedding_length", H),
                       ("feed_forward_length", I), ("attention.head_count", a.heads),
                       ("attention.head_count_kv", a.kv_heads), ("attention.key_length", hd),
                       ("attention.value_length", hd), ("expert_count", E), ("expert_used_count", a.experts_used),
                       ("expert_feed_forward_length", I)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", 1000000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    Q8 = gguf.GGMLQuantizationType.Q8_0

    def q8(name: str, shape: tuple[int, ...], std: float = 0.02) -> None:  # shape in numpy order (rows last)
        w.add_tensor(name, q8_rows(rng, shape, std), raw_dtype=Q8)

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, (1 + 0.05 * rng.standard_normal(n)).astype(np.float32))

    q8("token_embd.weight", (V, H), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight", H)
        q8(p + "attn_q.weight", (a.heads * hd, H))
        q8(p + "attn_k.weight", (a.kv_heads * hd, H))
        q8(p + "attn_v.weight", (a.kv_heads * hd, H))
        q8(p + "attn_output.weight", (H, a.heads * hd))
        ones(p + "attn_q_norm.weight", hd)
        ones(p + "attn_k_norm.weight", hd)
        ones(p + "ffn_norm.weight", H)
        w.add_tensor(p + "ffn_gate_inp.weight", (0.05 * rng.standard_normal((E, H))).astype(np.float32))
        q8(p + "ffn_gate_exps.weight", (E, I, H))
        q8(p + "ffn_up_exps.weight", (E, I, H))
        q8(p + "ffn_down_exps.weight", (E, H, I))
    ones("output_norm.weight", H)
    q8("output.weight", (V, H), 0.05)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    total = V * H * 2 + L * (2 * (a.heads + a.kv_heads) * hd * H + E * 3 * H * I + E * H)
    active = V * H + L * (2 * (a.heads + a.kv_heads) * hd * H + a.experts_used * 3 * H * I + E * H)
    print(f"wrote {a.out} ({a.out.stat().st_size / 1e9:.2f} GB): {total / 1e9:.2f}B parameters, "
          f"{active / 1e9:.2f}B read per token (the embedding row aside)")


if __name__ == "__main__":
    main()
