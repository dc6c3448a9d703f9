"""Small C kernels for what torch does not do well on this CPU class, built on first use.

attend.c: the exact attention rows of a forward (each query row over exactly its own keys, in a
fixed order) for every sequence of a batch in one call, where torch needed ~8 small ops per row
and layer; row-invariant by construction like w8a8.c.

gguf_linear.c: a matmul over a GGUF file's own quantized blocks (Q4_0 ... Q8_0, Q4_K, Q5_K, Q6_K),
unpacked inside the kernel, with activations quantized as w8a8.c's (gguf_acts.c) and integer dot products:
the weights the file holds, exactly (model/linear.py, the gguf format). Row-invariant the same way. With
gguf_repack.c (the blocks' bits reordered at load, gguf_blocks.h) and gguf_values.c (their values: embedding
rows, a prefill's dense weight) it makes the gguf library.

rows.c: RMS norm, the rotary embedding, the KV-cache write and the MLP's activation of a forward's rows,
one call each where torch took ~5-20 us a call (several small ops); row-wise, the rotation bitwise torch's,
the activation within a few ulps of the exact value (its own exp).

moe.c: a mixture-of-experts layer's routing and routed experts (each expert's gate, up, activation and down over
the rows that chose it, and each row's weighted sum) in one C call into gguf_linear.c and rows.c (model/moe.py;
see moe.c).

step.c: the decoder layers of an exact forward over gguf-format weights in one C call, through function
pointers into the three above (the same code, the same bits as the per-op path; see step.c).

w8a8.c: int8 weights x int8 activations (blocks of 32, llama.cpp's Q8_0 layout) with AVX2 integer
dot products. torch's weight-only int8 kernel (bf16 activations) reads ~9 GB/s for one row and
costs ~4x for four; this one reads ~13-15 GB/s per core and costs ~2x for four rows, which is what
makes verifying a draft cheap. Every output row is computed in one fixed order whatever the batch,
so a k-token forward stays bitwise k one-token forwards (model/transformer.py, Numerics).

The modules: cpu (CPU flags, environment switches, the prefill path), build (compiling a library into
$SPECDEC_HOME/kernels, keyed by a digest of its sources), libraries (loading each library with its ctypes
signatures), weights (huge-page memory, GGUF blocks repacked for gguf_linear.c), ops (the ops on torch tensors),
moe_experts (moe.c's structs and op), step_structs (step.c's argument structs). What callers use is
re-exported here.
"""

from specdec.model.kernels.build import why_unavailable
from specdec.model.kernels.cpu import env_flag, has_vnni, prefill_path
from specdec.model.kernels.libraries import (ATTEND_MAX_GROUP, ATTEND_MAX_HEAD_DIM, attend, attend_build, gguf,
                                             gguf_build, kernel_isa, moe, rows, step, w8a8, w8a8_build)
from specdec.model.kernels.moe_experts import (MoEExperts, MoEKernels, MoERoute, moe_experts, moe_kernels, moe_route,
                                               moe_rows)
from specdec.model.kernels.ops import (act_mul, attend_rows, gguf_linear, gguf_quantize, gguf_rows, gguf_to_dense,
                                       rms_norm_rows, rope, store_rows, w8a8_matmul)
from specdec.model.kernels.step_structs import StepForward, StepKernels, StepLayer, StepLinear, step_kernels
from specdec.model.kernels.weights import HUGE_PAGE, GGUFParts, empty_huge, gguf_repack

__all__ = [
    # cpu: what this machine offers, and the switches
    "env_flag", "has_vnni", "prefill_path",
    # libraries: each loaded once, or None with why_unavailable(name) saying why
    "w8a8", "w8a8_build", "attend", "attend_build", "gguf", "gguf_build", "rows", "step", "moe", "kernel_isa",
    "why_unavailable", "ATTEND_MAX_HEAD_DIM", "ATTEND_MAX_GROUP",
    # ops on torch tensors
    "rms_norm_rows", "rope", "act_mul", "store_rows", "gguf_quantize", "gguf_linear", "gguf_rows", "gguf_to_dense",
    "w8a8_matmul", "attend_rows",
    # weights in the kernels' layout
    "HUGE_PAGE", "empty_huge", "gguf_repack", "GGUFParts",
    # moe.c: a mixture layer's routed experts in one call, and its argument structs
    "moe_rows", "moe_route", "moe_experts", "MoEExperts", "MoEKernels", "MoERoute", "moe_kernels",
    # step.c's argument structs
    "StepKernels", "step_kernels", "StepLinear", "StepLayer", "StepForward",
]
