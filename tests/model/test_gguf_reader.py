"""model/gguf_reader.py's fast GGUF reader gives exactly what the gguf package's reader gives, and refuses a cut file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGUFReader, GGUFValueType

from helpers.tiny import make_gguf_model
from specdec.model.errors import ModelFileError
from specdec.model.gguf_loader import read_gguf
from specdec.model.gguf_reader import reader_class


def test_fields_and_tensors_equal_the_stock_reader(tmp_path):
    path = make_gguf_model(tmp_path / "m.gguf", tensor_type="Q8_0")
    fast, stock = reader_class()(path), GGUFReader(path)
    assert list(fast.fields) == list(stock.fields)
    for key, want in stock.fields.items():
        got = fast.fields[key]
        assert (got.offset, got.data, got.types) == (want.offset, want.data, want.types), key
        assert len(got.parts) == len(want.parts), key
        assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got.parts, want.parts)), key
        assert got.contents() == want.contents(), key
        if want.types[0] == GGUFValueType.ARRAY and want.data:
            for index in (0, -1, slice(1, 4), slice(None, None, -2)):
                assert got.contents(index) == want.contents(index), (key, index)
    assert len(stock.fields["tokenizer.ggml.tokens"].contents()) == 512  # the arrays took the fast path
    assert fast.data_offset == stock.data_offset
    assert [(t.name, t.tensor_type, t.data_offset) for t in fast.tensors] == \
           [(t.name, t.tensor_type, t.data_offset) for t in stock.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(fast.tensors, stock.tensors))


@pytest.mark.parametrize("keep", [0.2, 0.5])
def test_a_file_cut_inside_the_token_arrays_is_refused(tmp_path, keep):
    path = make_gguf_model(tmp_path / "m.gguf")
    data = path.read_bytes()
    header_end = GGUFReader(path).data_offset
    path.write_bytes(data[: int(header_end * keep)])
    with pytest.raises(ModelFileError, match="m.gguf"):
        read_gguf(path)


def test_blocks_are_a_view_that_cannot_write_the_file(tmp_path):
    """GGUFModel.blocks hands over the mapped file's bytes without a copy (copy-on-write): writing into
    them changes the process's pages, never the file."""
    path = make_gguf_model(tmp_path / "m.gguf", tensor_type="Q8_0")
    before = path.read_bytes()
    model = read_gguf(path)
    name = next(n for n in model.names() if n.endswith("down_proj.weight"))
    kind, blocks = model.blocks(name)
    assert kind == "Q8_0" and blocks.dtype == torch.uint8
    blocks.fill_(7)
    assert model.blocks(name)[1].eq(7).all()  # the same pages: no copy was made
    assert path.read_bytes() == before


def test_the_quantization_label_is_the_same_at_every_run():
    """The matrices' most common type named a file without general.file_type; ties went by set order,
    which PYTHONHASHSEED changes, and inspect of a file specdec cannot run said "None" or "19"."""
    from specdec.model.gguf_loader import quant_label

    assert quant_label(15, ["Q4_K", "Q6_K"]) == "Q4_K_M"  # llama.cpp's own name
    for order in (["Q8_0", "Q4_0"], ["Q4_0", "Q8_0"]):
        assert quant_label(None, order) == "Q4_0"  # a tie: the first by name
    assert quant_label(19, ["Q6_K", "IQ2_XXS", "IQ2_XXS"]) == "IQ2_XXS"  # a number the table lacks
    assert quant_label(None, []) == "F32"


def test_a_gguf_specdec_cannot_run_is_labelled_by_its_matrices(tmp_path):
    from specdec.model.checkpoint_facts import raw_checkpoint

    path = make_gguf_model(tmp_path / "m.gguf", tensor_type="Q8_0")
    assert raw_checkpoint(path).quant == "Q8_0"
