"""gguf's GGUFReader with fast array fields: reader_class()(path) reads a GGUF file's header.

gguf's own reader builds a numpy view per element of an array field (the tokenizer's ~150k tokens,
types and merges); here those arrays are _ArrayField, decoded straight from the mapped bytes.
"""

from __future__ import annotations

import functools
import struct

import numpy as np
from gguf import GGUFReader, GGUFValueType, ReaderField


class _ArrayField:
    """One GGUF array field (the tokenizer's ~150k tokens, types and merges), read without a numpy view per
    element, which is what makes gguf's reader slow (9.6 s for qwen2.5-coder-1.5b's header): `contents()`
    decodes straight from the mapped bytes. `parts` and `data`, built on first use, are what gguf's
    ReaderField holds for the same field, so the object stands in for one (gguf==0.19.0)."""

    def __init__(self, offset: int, name: str, head: list, buffer: np.ndarray, start: int, item, scalar):
        self.offset, self.name, self.item, self._head, self._buffer = offset, name, item, head, buffer
        self._itype = buffer[start : start + 4].view(np.uint32)
        self._count = buffer[start + 4 : start + 12].view(np.uint64)
        count, offs = int(self._count[0]), start + 12
        self.types = [GGUFValueType.ARRAY, item] if count else [GGUFValueType.ARRAY]
        if scalar is not None:
            end = offs + count * np.dtype(scalar).itemsize
            if end > len(buffer):
                raise ValueError(f"array {name!r} at offset {offset} runs past the end of the file")
            self._values, self._starts, self._lengths = buffer[offs:end].view(scalar), None, None
        else:  # strings: each a uint64 length and its bytes, so found one after another
            unpack, size, starts, lengths = struct.Struct("<Q").unpack_from, len(buffer), [], []
            for _ in range(count):
                n = unpack(buffer, offs)[0] if offs + 8 <= size else size
                if offs + 8 + n > size:
                    raise ValueError(f"string array {name!r} at offset {offset} runs past the end of the file")
                starts.append(offs + 8)
                lengths.append(n)
                offs += 8 + n
            end, self._values, self._starts, self._lengths = offs, None, starts, lengths
        self.size = end - start  # the bytes after the field's type

    def contents(self, index_or_slice: int | slice = slice(None)):
        if self._values is not None:
            return self._values[index_or_slice].tolist()
        raw = memoryview(self._buffer)
        if isinstance(index_or_slice, int):
            s, n = self._starts[index_or_slice], self._lengths[index_or_slice]
            return str(raw[s : s + n], "utf-8")
        return [str(raw[s : s + n], "utf-8")
                for s, n in zip(self._starts[index_or_slice], self._lengths[index_or_slice])]

    @functools.cached_property
    def parts(self) -> list[np.ndarray]:
        parts = [*self._head, self._itype, self._count]
        if self._values is not None:
            parts += (self._values[i : i + 1] for i in range(len(self._values)))
        else:
            for s, n in zip(self._starts, self._lengths):
                parts += (self._buffer[s - 8 : s].view(np.uint64), self._buffer[s : s + n])
        return parts

    @functools.cached_property
    def data(self) -> list[int]:
        first, count = len(self._head) + 2, int(self._count[0])
        if self._values is not None:
            return list(range(first, first + count))
        return list(range(first + 1, first + 2 * count, 2))


def reader_class():
    """gguf's GGUFReader, with the arrays of scalars and strings read as _ArrayField (same contents, fast)."""
    class Reader(GGUFReader):
        def __init__(self, path, mode="c"):
            # copy-on-write: the file's blocks can be handed to torch without a copy (GGUFModel.blocks),
            # and nothing written to them could reach the file
            super().__init__(path, mode)

        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value):
            self._plain = value.view(np.ndarray)  # same bytes, without np.memmap's per-slice hooks

        def _build_fields(self, offs, count):
            # gguf's own loop, but an array of scalars or strings becomes an _ArrayField
            for _ in range(count):
                orig_offs = offs
                klen, kdata = self._get_str(offs)
                offs += int(klen.nbytes + kdata.nbytes)
                raw_type = self._get(offs, np.uint32)
                offs += int(raw_type.nbytes)
                head, name = [klen, kdata, raw_type], str(bytes(kdata), encoding="utf-8")
                item = self._array_item(offs) if raw_type[0] == GGUFValueType.ARRAY else None
                if item is not None:
                    field = _ArrayField(orig_offs, name, head, self._plain, offs, item,
                                        self.gguf_scalar_to_np.get(item))
                    size = field.size
                else:
                    size, parts, idxs, types = self._get_field_parts(offs, raw_type[0])
                    field = ReaderField(orig_offs, name, head + parts, [i + len(head) for i in idxs], types)
                self._push_field(field, skip_sum=True)
                offs += size
            return offs

        def _array_item(self, offs):
            """The item type of the array at offs when _ArrayField reads it, else None (nested arrays, which
            are rare and short, and byte-swapped files go through gguf's own code)."""
            raw_itype = self._get(offs, np.uint32)
            if self.byte_order != "I" or len(raw_itype) != 1 or offs + 12 > len(self._plain):
                return None
            item = GGUFValueType(int(raw_itype[0]))
            return item if item == GGUFValueType.STRING or item in self.gguf_scalar_to_np else None

    return Reader
