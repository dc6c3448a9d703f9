"""Llama 3.x RoPE scaling from config.json and from GGUF rope_freqs, checked against transformers;
config fields that change the math and that specdec does not compute are a clear error."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import make_gguf_model, make_hf_model
from specdec.model.config import llama3_rope_factors
from specdec.model.errors import ModelFileError
from specdec.model.load import load_model

# original context 64 on a 16-dim head: some frequencies kept, some divided by 8, some blended
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
TOKENS = [(7 * i + 3) % 500 for i in range(120)]  # positions well past the original context


def specdec_logits(path) -> torch.Tensor:
    model = load_model(str(path), "fp32", progress=False)
    tr = model.transformer
    cache = tr.new_cache(256)
    return tr.forward(torch.tensor([TOKENS]), cache, [cache.allocate()]).logits[0]  # (T, V)


def test_llama3_factors_cover_all_three_bands():
    factors = llama3_rope_factors(16, 10000.0, LLAMA3)
    assert factors[0] == 1.0 and factors[-1] == 8.0
    assert any(1.0 < f < 8.0 for f in factors)


def test_llama3_scaling_matches_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = make_hf_model(tmp_path / "llama31", extra_config={"rope_scaling": LLAMA3})
    ours = specdec_logits(folder)
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        theirs = ref(torch.tensor([TOKENS])).logits[0]
    assert (ours - theirs).abs().max() < 1e-4
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    plain = specdec_logits(make_hf_model(tmp_path / "plain"))  # the same weights without scaling
    assert (plain - theirs).abs().max() > 1e-2  # so the scaling is what made them agree


def test_gguf_rope_freqs_equal_the_config_scaling(tmp_path):
    factors = torch.tensor(llama3_rope_factors(16, 10000.0, LLAMA3))
    gguf = make_gguf_model(tmp_path / "llama31.gguf", extra_weights={"rope_freqs.weight": factors})
    assert load_model(str(gguf), "fp32", progress=False).config.rope_freq_factors == tuple(factors.tolist())
    hf = make_hf_model(tmp_path / "llama31", extra_config={"rope_scaling": LLAMA3})
    assert (specdec_logits(gguf) - specdec_logits(hf)).abs().max() < 1e-5


@pytest.mark.parametrize("extra, message", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling 'yarn' is not supported"),
    ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, "rope scaling 'longrope' is not supported"),
    ({"rope_scaling": {"type": "linear"}}, "linear rope scaling needs a positive factor"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
     "rope scaling 'dynamic' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3 rope_scaling lacks 'low_freq_factor'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"mlp_bias": True}, "mlp_bias is true"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported"),
    ({"use_sliding_window": True, "sliding_window": 128}, "sliding-window attention .window 128. is not supported"),
])
def test_math_specdec_does_not_compute_is_a_clear_error(tmp_path, extra, message):
    folder = make_hf_model(tmp_path / "m", extra_config=extra)
    with pytest.raises(ModelFileError, match=message):
        load_model(str(folder), "fp32", progress=False)


def test_fields_that_do_not_change_the_math_still_load(tmp_path):
    extra = {"rope_scaling": None, "hidden_act": "silu", "use_sliding_window": False, "sliding_window": 4096,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    model = load_model(str(make_hf_model(tmp_path / "m", extra_config=extra)), "fp32", progress=False)
    assert model.config.rope_freq_factors is None
