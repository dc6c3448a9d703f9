"""GLM-4.5's nextn (MTP) layer: a decoder layer whose MLP is a mixture, behind enorm / hnorm / eh_proj and
shared_head.norm (drafters/mtp.py's deepseek layout, the mixture of model/moe.py).

transformers 5.24 drops GLM's nextn layer, but its block is transformers' own Glm4MoeDecoderLayer: the tiny
checkpoint (helpers/moe.mtp_folder) holds it as model.layers.2, which from_pretrained(num_hidden_layers=3)
loads as transformers' layer 2. The reference wraps that block as vLLM's glm4_moe_mtp.py does:

    x = eh_proj([enorm(embed(t_{j+1})); hnorm(h_j)]);  out = block(x) at position j;  logits = head(norm_s(out))

h_j the target's final-normed rows, `out` what the next depth is fed. Read from the folder and from llama.cpp's
conversion of it (FIXTURE/glm4_moe_mtp.gguf: blk.2.nextn.* and the block's ffn_*_exps).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from helpers.moe import FIXTURE, fixture_folder
from helpers.spec import spec_for_model
from specdec.drafters.mtp import load_mtp_head
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model import kernels
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

TOKENS = [(7 * i + 3) % 270 for i in range(40)]
PROMPTS = [TOKENS[2:12], TOKENS[12:19], TOKENS[20:33]]
GGUF = FIXTURE / "glm4_moe_mtp.gguf"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return fixture_folder(tmp_path_factory.mktemp("glm-mtp") / "hf", "glm4_moe_mtp")


def load(path, fmt="fp32"):
    return load_model(str(path), fmt, progress=False, weight_cache=False)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference(folder, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (T-1, V), fed rows (T-1, H)) of the nextn layer over pairs (h_j, TOKENS[j+1]), j < T-1."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with_block = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, num_hidden_layers=3).eval()
    t = load_file(str(folder / "model.safetensors"))
    eps, p = target.config.rms_norm_eps, "model.layers.2."
    with torch.no_grad():
        hidden = target.model(input_ids=torch.tensor([TOKENS[:T]])).last_hidden_state[0, : T - 1]
        e = rms(t["model.embed_tokens.weight"][TOKENS[1:T]], t[p + "enorm.weight"], eps)
        x = torch.cat([e, rms(hidden, t[p + "hnorm.weight"], eps)], -1) @ t[p + "eh_proj.weight"].T
        positions = torch.arange(T - 1)[None]
        rope = with_block.model.rotary_emb(x[None], positions)
        out = with_block.model.layers[2](x[None], attention_mask=None, position_embeddings=rope,
                                         position_ids=positions)
        out = (out[0] if isinstance(out, tuple) else out)[0]
        logits = rms(out, t[p + "shared_head.norm.weight"], eps) @ t[p + "shared_head.head.weight"].T
    return logits, out


@pytest.mark.parametrize("source", ["folder", "llama.cpp-f16"])
def test_the_nextn_layer_is_transformers_block_behind_glms_projection(source, folder):
    model = load(folder if source == "folder" else GGUF)
    head, where = load_mtp_head(model, 128)
    assert where == "MTP layers in the checkpoint" and head.layout.name == "deepseek"
    assert head.mods[0].block.moe.cfg == model.config.moe  # the block's MLP is the target's kind of mixture
    T, L = 24, model.config.num_layers
    tr = model.transformer
    cache = tr.new_cache(64)
    out = tr.forward(torch.tensor([TOKENS[:T]]), cache, [cache.allocate()], exact=True, hidden_layers=(L,))
    feats = head.feature({L: out.hidden[L][0, : T - 1]})[None]  # (1, T-1, H)
    with torch.no_grad():
        logits, fed, _, _ = head.step(0, feats, torch.tensor([TOKENS[1:T]]), torch.arange(T - 1)[None], None, None,
                                      torch.ones(1, T - 1, T - 1, dtype=torch.bool).tril())
    want, want_fed = reference(folder, T)
    scale = want.abs().max().item()
    assert (logits[0] - want).abs().max().item() < 1e-4 * scale
    assert torch.equal(logits[0].argmax(-1), want.argmax(-1))
    assert (fed[0] - want_fed).abs().max().item() < 1e-4 * want_fed.abs().max().item()


FORMATS = ["fp32", pytest.param("gguf", marks=pytest.mark.skipif(kernels.gguf() is None,
                                                                  reason="no GGUF kernel here (no cc or no AVX2)"))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_draft_mtp_lights_up_by_itself_and_greedy_output_is_plain(fmt, folder):
    """auto picks draft-mtp for the file (its nextn layer found); greedy speculative output is plain decoding's
    alone and three requests batched, with drafts accepted and rejected."""
    model = load(GGUF, fmt)
    assert model.config.mtp_layers_declared == 1
    spec, _ = spec_for_model(model)
    assert "draft-mtp" in [d.kind for d in spec.drafters]
    mtp = SpecConfig(drafters=("draft-mtp",), draft_n_max=3)
    n = [20, 14, 16]
    plain = [Engine(model, max_len=128).generate(p, SamplingParams(), max_tokens=k).token_ids
             for p, k in zip(PROMPTS, n)]
    drafted = accepted = 0
    for prompt, k, want in zip(PROMPTS, n, plain):
        r = Engine(model, mtp, max_len=128).generate(prompt, SamplingParams(), max_tokens=k)
        assert r.token_ids == want
        drafted, accepted = drafted + r.stats.drafted, accepted + r.stats.accepted
    assert 0 < drafted and accepted < drafted  # a random nextn layer: rejected, mostly
    engine = Engine(model, mtp, max_len=128, max_sequences=3)
    reqs = [engine.admit(p, SamplingParams(), k) for p, k in zip(PROMPTS, n)]
    while not all(r.finished for r in reqs):
        engine.step_batch([r for r in reqs if not r.finished])
    for r, want in zip(reqs, plain):
        engine.finish(r)
        assert r.output == want
