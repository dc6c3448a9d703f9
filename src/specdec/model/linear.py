"""Weight storage formats and the matmul that goes with each.

Every format here except fp32 and bf16 is *row-invariant*: a row of the output is bitwise
the same whether the input has 1 row or 16 (measured on this project's CPU, see
docs/design.md, "Exactness"). That is what makes greedy speculative output bit-identical
to plain decoding. torch's dense fp32 and bf16 GEMMs are not (they pick kernels by the
row count: fp32 for 1 row, bf16 past 1152 inputs on an AVX512-BF16 EPYC), so those two
formats compute row by row when `exact=True`: a verify of k rows costs k one-row GEMMs
(bf16 at 8960x1536: 8.2 ms for 1 row, 40 ms for 5), so speculation pays little in them.

Formats, and what one decode step reads per weight element:
    fp32  4 bytes   reference numerics (parity tests with transformers)
    bf16  2 bytes   activations rounded to bf16 at the matmul
    int8  1 byte    per-output-channel symmetric, bf16 scales (torch._weight_int8pack_mm)
    int4  0.5 byte  groups of 32, asymmetric, bf16 scale+zero (torch._weight_int4pack_mm_for_cpu);
                    each group's grid is rebuilt from its own min and max, so a GGUF 4-bit file
                    is not kept exactly: Q4_1 blocks (their grid spans min..max) lose only the bf16
                    rounding of scale and zero; Q4_0 and Q4_K grids do not span their values'
                    range and move by up to half a step (measured 0.53 steps on Q4_K).
    w8a8  1 byte    int8's weights; activations quantized to int8 per block of 32 and integer
                    dot products (model/kernels: a small C kernel, AVX2), ~2x int8's speed
    gguf  as stored a GGUF file's own blocks (Q4_0 ... Q8_0, Q4_K, Q5_K, Q6_K), kept exactly and unpacked
                    inside the gguf library (model/kernels/gguf_linear.c), with w8a8's activations: the weights the file holds, as
                    llama.cpp computes them; a tensor of another type (F16, Q2_K, ...) is dequantized to
                    fp32 exactly and computed in fp32. GGUF files only (QLinear.from_gguf).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from specdec.model import kernels

WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4", "w8a8", "gguf")
CONVERTED_FORMATS = WEIGHT_FORMATS[:-1]  # the formats any checkpoint converts to (gguf: GGUF files only)
# torch's dense GEMMs: a row's bits depend on the rows beside it (kernels picked by the row count), so exact rows
# are computed one at a time in these
ROW_VARIANT_FORMATS = ("fp32", "bf16")
# GGML types the gguf library computes on -> ggml type id; K-quants come in super-blocks of 256 values
GGUF_KERNEL_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
_GGUF_BLOCK = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
               "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}  # values, bytes per block
INT4_GROUP = 32
INT8_MULTIPLE = 16  # torch._weight_int8pack_mm needs in_features % 16 == 0
DENSE_MIN_ROWS = 32  # an exact=False call with this many rows or more takes the dense path (int8, w8a8, gguf)
PREFILL_CHUNK_BYTES = 4 << 20  # the dense path converts this many bytes of weight values per GEMM (QLinear.prefill)


def _stored_format(fmt: str, out_features: int, in_features: int) -> str:
    """The format an (out_features, in_features) weight is stored in when `fmt` is asked for."""
    if fmt in ("int4", "w8a8") and in_features % INT4_GROUP != 0:
        fmt = "int8"  # rows that do not split into groups of 32 fall back to int8
    if fmt == "int4" and out_features % 16 != 0:
        fmt = "int8"  # torch's int4 packing takes whole blocks of 16 output rows (torch 2.13)
    if fmt == "int8" and in_features % INT8_MULTIPLE != 0:
        # torch's int8 kernel reads whole blocks of 16: other widths give garbage or crash (torch 2.13)
        fmt = "bf16"
    if fmt == "w8a8" and kernels.w8a8() is None:
        raise ValueError(f"--weights w8a8 needs specdec's W8A8 kernel, which is unavailable here "
                         f"({kernels.why_unavailable()}); use --weights int8")
    return fmt


def _gguf_kernel():
    if kernels.gguf() is None:
        raise ValueError(f"--weights gguf needs specdec's GGUF kernel, which is unavailable here "
                         f"({kernels.why_unavailable('gguf')}); use --weights int8")


def _values_per_row(kind: str, t: torch.Tensor) -> int:
    if kind == "F32":
        return t.shape[1]
    values, nbytes = _GGUF_BLOCK[kind]
    if t.dtype != torch.uint8 or t.dim() != 2 or t.shape[1] % nbytes:
        raise ValueError(f"a {kind} part must be (rows, blocks x {nbytes}) uint8, not {t.dtype} {tuple(t.shape)}")
    return t.shape[1] // nbytes * values


def dequantize_blocks(kind: str, blocks: torch.Tensor) -> torch.Tensor:
    """(rows, row_bytes) uint8 of a GGUF type -> (rows, K) float32, the values the file holds."""
    values = dequantize(blocks.numpy(), GGMLQuantizationType[kind])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(blocks.shape[0], -1)


class BlockRows:
    """A (V, H) table (the embedding) held as a GGUF tensor's blocks, in the file's layout or interleaved (a
    gguf-format QLinear's part, the interleaved layout of gguf_blocks.h: a tied output head's blocks are held once); looked-up rows
    are dequantized then, to exactly the file's values. rows[ids] -> (*ids.shape, H) float32, like a tensor's."""

    def __init__(self, kind: str, blocks: torch.Tensor, interleaved: bool = False):
        self.kind, self.blocks, self.interleaved = kind, blocks, interleaved
        self.shape = (blocks.shape[0], _values_per_row(kind, blocks))
        self.dtype = torch.float32

    def __getitem__(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(ids)
        flat = ids.reshape(-1)
        if flat.numel() and not 0 <= int(flat.min()) <= int(flat.max()) < self.shape[0]:
            raise IndexError(f"row ids out of range for a table of {self.shape[0]} rows")
        if self.interleaved or (self.kind in GGUF_KERNEL_TYPES and kernels.gguf() is not None):  # one C call
            rows = kernels.gguf_rows(GGUF_KERNEL_TYPES[self.kind], self.blocks, flat, self.shape[1], self.interleaved)
        else:
            rows = dequantize_blocks(self.kind, self.blocks[flat])
        return rows.reshape(*ids.shape, self.shape[1])

    def row_bytes(self) -> int:
        return self.blocks.shape[1]

    def numel(self) -> int:  # with element_size(): the bytes held, as for a tensor
        return self.blocks.numel()

    def element_size(self) -> int:
        return 1


def _layout(fmt: str, n: int, k: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """name -> (dtype, shape) of what QLinear holds for an (n, k) weight stored in `fmt` (bias aside)."""
    if fmt == "fp32":
        return {"weight": (torch.float32, (n, k))}
    if fmt == "bf16":
        return {"weight": (torch.bfloat16, (n, k))}
    if fmt == "int8":
        return {"weight": (torch.int8, (n, k)), "scale": (torch.bfloat16, (n,))}
    if fmt == "w8a8":
        return {"weight": (torch.int8, (n, k)), "scale": (torch.float32, (n,))}
    # int4: torch's packed CPU layout, two 4-bit values per byte
    return {"weight": (torch.uint8, (n, k // 2)), "scale_zero": (torch.bfloat16, (k // INT4_GROUP, n, 2))}


class QLinear:
    """y = x @ W.T (+ bias), with W stored in one of WEIGHT_FORMATS.

    x: (M, K) float32 -> (M, N) float32.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fmt: str):
        if fmt == "gguf":
            raise ValueError("the gguf format keeps a GGUF file's blocks: build it with QLinear.from_gguf")
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {fmt!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
        weight = weight.float()
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.float().contiguous()
        fmt = self.fmt = _stored_format(fmt, self.out_features, self.in_features)
        if fmt == "fp32":
            self.weight = weight.contiguous()
            if self.weight.data_ptr() % 64:  # e.g. a view into a mapped file: MKL's fp32 bits depend on alignment
                self.weight = self.weight.clone()
        elif fmt == "bf16":
            self.weight = weight.to(torch.bfloat16).contiguous()
        elif fmt in ("int8", "w8a8"):
            scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (N,)
            self.weight = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            self.scale = scale.to(torch.bfloat16) if fmt == "int8" else scale.contiguous()
        else:
            self._pack_int4(weight)

    @classmethod
    def from_gguf(cls, parts: list[tuple[str, torch.Tensor]], bias: torch.Tensor | None) -> QLinear:
        """The gguf-format QLinear whose weight is `parts` stacked row-wise, in order: (type, (rows,
        row_bytes) uint8) as GGUFModel.blocks gives the file's tensors, or ("F32", (rows, K) float32).
        Neighbouring parts of one type are joined, so a fused q/k/v of one type is one kernel call."""
        _gguf_kernel()
        self = cls.__new__(cls)
        self.fmt = "gguf"
        widths = {_values_per_row(kind, t) for kind, t in parts}
        if len(widths) != 1:
            raise ValueError(f"the parts of one linear have different widths {sorted(widths)}")
        self.in_features = widths.pop()
        if self.in_features % 32:
            parts = [("F32", t if kind == "F32" else dequantize_blocks(kind, t)) for kind, t in parts]
        joined: list[tuple[str, list[torch.Tensor]]] = []  # neighbours of one type, stacked when held
        for kind, t in parts:
            if joined and joined[-1][0] == kind:
                joined[-1][1].append(t)
            else:
                joined.append((kind, [t]))
        # held once, in the interleaved layout of gguf_blocks.h (the blocks interleaved; the same bytes and values), repacked
        # straight from the file's mapping: a fused q/k/v is not concatenated first
        self._kernel_parts = kernels.GGUFParts([
            (0, torch.cat(ts).float().contiguous()) if kind == "F32" else (GGUF_KERNEL_TYPES[kind], ts)
            for kind, ts in joined])
        self.parts = [(kind, t) for (kind, _), t in zip(joined, self._kernel_parts.tensors)]
        self.out_features = sum(t.shape[0] for t in self._kernel_parts.tensors)
        self.bias = None if bias is None else bias.float().contiguous()
        return self

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor this QLinear holds, by attribute name: weight, and scale / scale_zero / bias where
        it has them (a format that grows another tensor must list it in _layout, or from_tensors refuses);
        the gguf format's parts as part{i}.{type} (in the interleaved layout of gguf_blocks.h: the file's bytes reordered)."""
        out = {name: t for name, t in vars(self).items() if isinstance(t, torch.Tensor)}
        for i, (kind, t) in enumerate(getattr(self, "parts", ())):
            out[f"part{i}.{kind}"] = t
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], fmt: str, out_features: int,
                     in_features: int) -> QLinear:
        """The QLinear whose `tensors()` these are, built in `fmt` for an (out_features, in_features)
        weight, without converting anything (model/weight_cache.py stores and maps them back).

        Raises ValueError when a tensor is missing or extra, or has another dtype or shape than `fmt`
        stores. Example: QLinear.from_tensors(q.tensors(), "int8", *q.weight.shape) computes what q does.
        """
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {fmt!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
        if fmt == "gguf":
            raise ValueError("the gguf format reads its blocks from the GGUF file (QLinear.from_gguf); "
                             "it is never converted or cached")
        self = cls.__new__(cls)
        self.out_features, self.in_features = out_features, in_features
        self.fmt = _stored_format(fmt, out_features, in_features)
        expected = _layout(self.fmt, out_features, in_features)
        if "bias" in tensors:
            expected["bias"] = (torch.float32, (out_features,))
        if set(tensors) != set(expected):
            raise ValueError(f"the {self.fmt} ({out_features}, {in_features}) linear holds {sorted(expected)}, "
                             f"not {sorted(tensors)}")
        for name, (dtype, shape) in expected.items():
            t = tensors[name]
            if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
                raise ValueError(f"{name} of the {self.fmt} ({out_features}, {in_features}) linear is "
                                 f"{t.dtype} {tuple(t.shape)}; expected contiguous {dtype} {shape}")
        self.bias = tensors.get("bias")
        for name in expected:
            setattr(self, name, tensors[name])
        return self

    def _pack_int4(self, weight: torch.Tensor) -> None:
        n, k = weight.shape
        groups = weight.reshape(n, k // INT4_GROUP, INT4_GROUP)
        low = groups.amin(-1, keepdim=True)
        high = groups.amax(-1, keepdim=True)
        scale = ((high - low) / 15.0).clamp(min=1e-12)
        q = torch.round((groups - low) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
        self.weight = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        # torch's int4 kernel computes (q - 8) * scale + zero
        zero = low + 8.0 * scale
        self.scale_zero = (
            torch.stack([scale.reshape(n, -1).t(), zero.reshape(n, -1).t()], dim=-1).to(torch.bfloat16).contiguous()
        )  # (K/32, N, 2)

    def nbytes(self) -> int:
        """Bytes read from memory per use (weights, scales, bias)."""
        if self.fmt == "gguf":
            return sum(t.numel() * t.element_size() for t in self.tensors().values())
        tensors = [self.weight, self.bias, getattr(self, "scale", None), getattr(self, "scale_zero", None)]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def dense_weight(self) -> torch.Tensor:
        """(N, K) float32: the weight as this format represents it."""
        if self.fmt == "gguf":
            return self._gguf_values(torch.float32)
        if self.fmt in ("fp32", "bf16"):
            return self.weight.float()
        if self.fmt in ("int8", "w8a8"):
            return self.weight.float() * self.scale.float()[:, None]
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return torch._weight_int4pack_mm_for_cpu(eye, self.weight, INT4_GROUP, self.scale_zero).float().t()

    def __call__(self, x: torch.Tensor, exact: bool = True) -> torch.Tensor:
        # x: (M, K) float32
        if x.shape[-1] != self.in_features:  # the gguf kernel takes K from x: a wider x read past each row
            raise ValueError(f"an input {x.shape[-1]} wide for a linear of {self.in_features} inputs")
        if not exact and self.fmt in ("int8", "w8a8", "gguf") and x.shape[0] >= DENSE_MIN_ROWS:
            return self.prefill([x])[0]
        if self.fmt == "gguf":
            return self._gguf_matmul(x)
        if self.fmt in ROW_VARIANT_FORMATS:  # torch's dense GEMMs pick kernels by the row count: exact rows go alone
            # (bf16 rows change with their neighbours from 1152 inputs wide on an AVX512-BF16 EPYC)
            x = x.to(self.weight.dtype)
            if exact and x.shape[0] > 1:
                y = torch.cat([torch.nn.functional.linear(x[i : i + 1], self.weight) for i in range(x.shape[0])])
            else:
                y = torch.nn.functional.linear(x, self.weight)
            y = y.float()
        elif self.fmt == "int8":
            y = torch._weight_int8pack_mm(x.to(torch.bfloat16), self.weight, self.scale).float()
        elif self.fmt == "w8a8":
            return kernels.w8a8_matmul(x, self.weight, self.scale, self.bias)
        else:
            y = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.weight, INT4_GROUP, self.scale_zero).float()
        if self.bias is not None:
            y = y + self.bias
        return y

    def _gguf_values(self, dtype: torch.dtype) -> torch.Tensor:
        """(N, K) of dtype: the gguf parts' values (float32: exactly the file's; bf16: rounded), stacked."""
        return torch.cat([self._part_values(kind, t, dtype) for kind, t in self.parts])

    def _part_values(self, kind: str, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows of one gguf part (its blocks in the interleaved layout of gguf_blocks.h, or F32 values) -> (rows, K) of dtype."""
        if kind == "F32":
            return blocks.to(dtype)
        return kernels.gguf_to_dense(GGUF_KERNEL_TYPES[kind], blocks, self.in_features, dtype)

    def _gguf_matmul(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.gguf_linear(x, self._kernel_parts, self.bias)

    def prefill(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """self(x, exact=False) for each x (M_i, K), computed as each would be alone.

        int8 / w8a8 with many rows: the int8 values widened once for all x (exactly: |q| <= 127
        fits bf16's 8-bit mantissa), a dense GEMM per x, then the per-channel scale. gguf: the
        file's values (rounded to bf16 where the GEMM is bf16; model/kernels/gguf_values.c), then a dense
        GEMM per x. Both a few MB of weight rows at a time (_dense_chunks). The weight-only kernels
        cost the same per row whatever the row count (0.04 ms per row for a 1536 x 576 matrix here);
        this costs 13x less at 1661 rows. Its rows depend on
        how many there are (not row-invariant), which is why only exact=False calls take it.
        Where the CPU has no native bf16 (kernels.prefill_path: "exact"), gguf and w8a8 run their
        exact integer kernels instead, which beat a float32 GEMM there, and int8 a float32 GEMM.
        """
        if self.fmt not in ("int8", "w8a8", "gguf") or all(x.shape[0] < DENSE_MIN_ROWS for x in xs):
            return [self(x, False) for x in xs]
        path = kernels.prefill_path()
        if path == "exact" and self.fmt in ("gguf", "w8a8"):
            return [self(x) for x in xs]
        dtype = torch.bfloat16 if path == "bf16" else torch.float32
        dense = [x.to(dtype) if x.shape[0] >= DENSE_MIN_ROWS else None for x in xs]
        ys = [torch.empty(x.shape[0], self.out_features) if xd is not None else None for x, xd in zip(xs, dense)]
        for row, weight in self._dense_chunks(dtype):  # each chunk's values once for all x
            rows = slice(row, row + weight.shape[0])
            for xd, y in zip(dense, ys):
                if xd is not None:
                    y[:, rows] = torch.nn.functional.linear(xd, weight)
        out = []
        for x, y in zip(xs, ys):
            if y is None:
                out.append(self(x, False))
                continue
            y = y if self.fmt == "gguf" else y * self.scale.float()
            out.append(y if self.bias is None else y + self.bias)
        return out

    def _dense_chunks(self, dtype: torch.dtype) -> Iterator[tuple[int, torch.Tensor]]:
        """(first output row, (n, K) of dtype) over the weight's rows, PREFILL_CHUNK_BYTES of values at a time:
        gguf, the file's values (as _gguf_values gives them); int8 / w8a8, the int8 values widened (exactly).

        A prefill GEMM reads each chunk while it is still in cache. Converting the whole weight first would
        write and read back 2 bytes a value (4 in float32) through memory, and tensors past glibc's 32 MB mmap
        threshold come back as fresh pages each call (qwen2.5-coder-1.5b's fused gate/up, 55 MB in bf16:
        182 ms to convert for a 19 ms GEMM). torch's bf16 GEMM gives each output column the same bits
        whatever columns share its call (measured on the 1.5B's and smaller shapes), so chunking keeps them.
        """
        n = max(1, PREFILL_CHUNK_BYTES // ((2 if dtype == torch.bfloat16 else 4) * self.in_features))
        if self.fmt != "gguf":
            for row in range(0, self.out_features, n):
                yield row, self.weight[row : row + n].to(dtype)
            return
        row = 0
        for kind, t in self.parts:
            for start in range(0, t.shape[0], n):
                yield row + start, self._part_values(kind, t[start : start + n], dtype)
            row += t.shape[0]
