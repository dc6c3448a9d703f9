"""Llama, Qwen2 and Qwen3 against transformers, the independent reference.

Three sources of a tiny checkpoint, each read by both runtimes:
- folders transformers itself writes (its config and model classes, random weights, save_pretrained),
  so a name our test writer and our loader both got wrong cannot hide;
- folders our writer (helpers/tiny.make_hf_model) writes, checked to be what transformers writes;
- the tiny GGUF (helpers/tiny.make_gguf_model, llama.cpp's q/k row permutation applied), which
  transformers reads with its own GGUF reader (the gguf package's dequantization, its own un-permute).

fp32 logits agree within 1e-4 of the largest logit; 16 greedy tokens are identical.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from helpers.tiny import make_gguf_model, make_hf_model, write_tokenizer_json
from specdec.engine.engine import Engine
from specdec.model import kernels
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

TOKENS = [(7 * i + 3) % 500 for i in range(40)]
PROMPT = TOKENS[:10]
SIZES = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6)
ROPE_THETA = 500_000.0  # not the default 10000: config.json's rope_parameters (transformers 5) must be read
FAMILIES = ["llama", "qwen2", "qwen3"]
TIES = [pytest.param(False, id="own-head"), pytest.param(True, id="tied")]


def reference_classes(arch: str):
    """transformers' (config class, model class) for a family."""
    import transformers

    return {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[arch]


def transformers_folder(folder, arch: str, tie: bool, seed: int = 0):
    """A checkpoint transformers writes: its own config class and model, every parameter random (norm weights
    near 1, Qwen2's q/k/v biases and Qwen3's q/k norms included), saved with save_pretrained (which writes
    the RoPE base as rope_parameters.rope_theta, not rope_theta)."""
    config_class, model_class = reference_classes(arch)
    config = config_class(**SIZES, tie_word_embeddings=tie, bos_token_id=None, eos_token_id=2, pad_token_id=None,
                          rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    model = model_class(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else noise * (0.3 if "embed" in name else 0.08))
    model.save_pretrained(folder)
    write_tokenizer_json(folder, SIZES["vocab_size"])
    return folder


def reference(folder, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()


def reference_logits(ref, tokens=TOKENS) -> torch.Tensor:
    with torch.no_grad():
        return ref(torch.tensor([tokens])).logits[0]  # (T, V)


def specdec_logits(model, tokens=TOKENS, exact=True) -> torch.Tensor:
    tr = model.transformer
    cache = tr.new_cache(256)
    return tr.forward(torch.tensor([tokens]), cache, [cache.allocate()], exact=exact).logits[0]  # (T, V)


def assert_logits_agree(ours: torch.Tensor, theirs: torch.Tensor, rel: float = 1e-4) -> None:
    """Within `rel` of the largest logit (fp32 rounding grows with the logits: a tied head gives ~20)."""
    scale = max(1.0, theirs.abs().max().item())
    err = (ours - theirs).abs().max().item()
    assert err <= rel * scale, f"max |specdec - transformers| = {err:.3e}, largest logit {scale:.2f}"
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def greedy_pair(model, ref, n: int = 16) -> tuple[list[int], list[int]]:
    """(specdec's plain greedy tokens, transformers' greedy tokens) after PROMPT, an EOS ending either run."""
    ours = Engine(model, max_len=256).generate(PROMPT, SamplingParams(), max_tokens=n).token_ids
    eos = sorted(model.tokenizer.eos_ids)
    theirs = ref.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                          pad_token_id=eos[0])[0, len(PROMPT):].tolist()
    return ours, theirs[:-1] if theirs and theirs[-1] in eos else theirs


def check_against_transformers(folder, model=None, ref=None) -> None:
    model = model or load_model(str(folder), "fp32", progress=False, weight_cache=False)
    ref = ref or reference(folder)
    theirs = reference_logits(ref)
    for exact in (True, False):
        assert_logits_agree(specdec_logits(model, exact=exact), theirs)
    ours, theirs_greedy = greedy_pair(model, ref)
    assert len(ours) == 16
    assert ours == theirs_greedy


# -- folders transformers writes ----------------------------------------------------------------------------
@pytest.mark.parametrize("tie", TIES)
@pytest.mark.parametrize("arch", FAMILIES)
def test_a_folder_transformers_wrote_gives_its_logits_and_greedy_tokens(tmp_path, arch, tie):
    folder = transformers_folder(tmp_path / arch, arch, tie)
    model = load_model(str(folder), "fp32", progress=False, weight_cache=False)
    c = model.config
    assert (c.arch, c.tie_embeddings, c.qkv_bias, c.qk_norm) == (arch, tie, arch == "qwen2", arch == "qwen3")
    check_against_transformers(folder, model)


# -- folders our writer writes ------------------------------------------------------------------------------
@pytest.mark.parametrize("tie", TIES)
@pytest.mark.parametrize("arch", FAMILIES)
def test_a_folder_our_writer_wrote_gives_transformers_logits_and_greedy_tokens(tmp_path, arch, tie):
    folder = make_hf_model(tmp_path / arch, arch=arch, extra_config={"tie_word_embeddings": tie})
    ref = reference(folder)
    assert type(ref) is reference_classes(arch)[1]
    check_against_transformers(folder, ref=ref)


@pytest.mark.parametrize("tie", TIES)
@pytest.mark.parametrize("arch", FAMILIES)
def test_our_writer_writes_what_transformers_writes(tmp_path, arch, tie):
    """Tensor names and shapes as transformers' own model saves them, and a config.json that transformers
    reads back to the sizes it would have written."""
    ours = make_hf_model(tmp_path / "ours", arch=arch, extra_config={"tie_word_embeddings": tie})
    theirs = transformers_folder(tmp_path / "theirs", arch, tie)

    def shapes(folder):
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}

    assert shapes(ours) == shapes(theirs)
    from transformers import AutoConfig

    read = AutoConfig.from_pretrained(ours).to_dict()
    written = json.loads((theirs / "config.json").read_text())
    for key in (*SIZES, "model_type", "tie_word_embeddings", "hidden_act", "eos_token_id"):
        assert read[key] == written[key], key
    # Qwen2 has q/k/v biases whatever attention_bias says; Llama and Qwen3 only where it says true
    assert read.get("attention_bias", False) == written.get("attention_bias", False) or arch == "qwen2"
    assert read["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}  # the writer's rope_theta
    assert written["rope_parameters"] == {"rope_type": "default", "rope_theta": ROPE_THETA}
    assert "rope_theta" not in written  # transformers 5 writes the base inside rope_parameters only


# -- the tiny GGUF, read by transformers' GGUF reader ---------------------------------------------------------
GGUF_TYPES = [pytest.param(("F32", {}), id="F32"), pytest.param(("Q8_0", {}), id="Q8_0"),
              pytest.param(("Q4_0", {}), id="Q4_0"),
              # K-quants need rows of 256: a wider model, its matrices Q4_K / Q5_K / Q6_K in turn
              pytest.param((["Q4_K", "Q5_K", "Q6_K"], dict(hidden=256, intermediate=512)), id="K-quants")]


@pytest.fixture(scope="module", params=GGUF_TYPES)
def gguf_pair(request, tmp_path_factory):
    """(path, transformers' model) for one tiny GGUF file."""
    tensor_type, sizes = request.param
    folder = tmp_path_factory.mktemp("gguf")
    path = make_gguf_model(folder / "m.gguf", tensor_type=tensor_type, **sizes)
    return path, reference(folder, gguf_file=path.name)


def test_transformers_reads_the_tiny_gguf_as_specdec_does(gguf_pair):
    """Both dequantize the same blocks, so specdec's fp32 format of the file agrees to fp32 rounding; the
    q/k rows come back in transformers' order only if the un-permute inverts llama.cpp's permutation."""
    path, ref = gguf_pair
    check_against_transformers(path, ref=ref)


@pytest.mark.skipif(kernels.gguf() is None, reason="no GGUF kernel here (no cc or no AVX2)")
def test_the_gguf_format_tracks_transformers_on_the_tiny_gguf(gguf_pair):
    """specdec's default format computes on the file's blocks with int8 activations (llama.cpp's scheme), so
    only the argmax is held to transformers' (measured: max |diff| 3e-4 .. 0.95 of logits up to 6)."""
    path, ref = gguf_pair
    ours = specdec_logits(load_model(str(path), "gguf", progress=False, weight_cache=False))
    theirs = reference_logits(ref)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert (ours - theirs).abs().max() < 0.25 * theirs.abs().max()
