"""draft-eagle3 against a float64 computation of EAGLE-3's published formula (as vLLM and SpecForge
compute it), on a head folder written here in the published layout, never by specdec's writer:

    g      = fc([h_a; h_b; h_c])               target hidden rows of taps (2, N // 2, N - 3), 3H -> H
    a      = [RMSNorm_in(embed(token)); RMSNorm_hidden(g)]          2H: the embedding first
    x      = g + o_proj(attention(q, k, v of a, RoPE, causal))      the residual is g, not its norm
    x      = x + down(silu(gate(y)) * up(y)),  y = RMSNorm_post(x)
    logits = lm_head(RMSNorm(x)) over the draft vocabulary; draft id d is target id d + d2t[d]
    the next draft step feeds x (before the final norm) in place of g, one position further on.

The target's hidden rows come from transformers (output_hidden_states), not from specdec's runtime.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from helpers.tiny import EAGLE3_DRAFT_IDS as DRAFT_IDS
from helpers.tiny import make_hf_model
from specdec.drafters.eagle3 import load_eagle3_head, make_eagle3_drafter
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

LAYERS = 8  # EAGLE-3's taps (2, N // 2, N - 3) = (2, 4, 5): three distinct layers, none the last
TAPS = (2, LAYERS // 2, LAYERS - 3)
H, HEADS, KV_HEADS, HD, INTER, V = 64, 4, 2, 16, 96, 512
EPS, THETA = 1e-6, 10000.0
PROMPT = [(11 * i + 5) % 500 for i in range(12)]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_hf_model(tmp_path_factory.mktemp("eagle3-target") / "t", layers=LAYERS)


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(str(target_dir), "fp32", progress=False, weight_cache=False)


def published_head(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random EAGLE-3 weights under the published names; every norm weight differs from 1 and from the others,
    so a norm applied to the wrong input shows."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    def norm(n):
        return 1 + w(n, scale=0.3)

    ids = DRAFT_IDS.long()
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    return {
        "fc.weight": w(H, 3 * H, scale=0.08),
        "midlayer.input_layernorm.weight": norm(H), "midlayer.hidden_norm.weight": norm(H),
        "midlayer.self_attn.q_proj.weight": w(HEADS * HD, 2 * H),
        "midlayer.self_attn.k_proj.weight": w(KV_HEADS * HD, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(KV_HEADS * HD, 2 * H),
        "midlayer.self_attn.o_proj.weight": w(H, HEADS * HD),
        "midlayer.post_attention_layernorm.weight": norm(H),
        "midlayer.mlp.gate_proj.weight": w(INTER, H), "midlayer.mlp.up_proj.weight": w(INTER, H),
        "midlayer.mlp.down_proj.weight": w(H, INTER),
        "norm.weight": norm(H), "lm_head.weight": w(len(ids), H, scale=0.5),
        "d2t": ids - torch.arange(len(ids)), "t2d": t2d,
    }


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    """config.json as EAGLE-3 heads are published (no eagle_config: the taps are EAGLE-3's default), float32
    weights (no rounding between the file and the formula)."""
    folder = tmp_path_factory.mktemp("eagle3-head")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu", "hidden_size": H,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "intermediate_size": INTER,
        "num_hidden_layers": 1, "rms_norm_eps": EPS, "rope_theta": THETA, "max_position_embeddings": 512,
        "vocab_size": V, "draft_vocab_size": len(DRAFT_IDS), "tie_word_embeddings": False}))
    save_file({k: v.contiguous() for k, v in published_head().items()}, str(folder / "model.safetensors"))
    return folder


# -- the formula, in float64 ------------------------------------------------------------------------------
def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x, positions):
    """x (T, heads, hd) rotated as Llama (rotate-half pairs i and i + hd/2), inverse frequencies theta^(-2i/hd)."""
    inv = THETA ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    angle = positions.double()[:, None] * inv[None]  # (T, hd/2)
    cos, sin = torch.cat([angle.cos()] * 2, -1)[:, None], torch.cat([angle.sin()] * 2, -1)[:, None]
    half = torch.cat([-x[..., HD // 2:], x[..., : HD // 2]], -1)
    return x * cos + half * sin


def eagle3_formula(weights, embed, g, tokens, positions):
    """g (T, H) the rows' residual features (fused taps, or a previous step's x), tokens (T,), positions (T,):
    each row attends itself and the rows before it. -> (target-vocabulary logits (T, V), -inf off the draft
    vocabulary; x (T, H) before the final norm)."""
    w = {k: v.double() for k, v in weights.items() if k not in ("d2t", "t2d")}
    p = "midlayer."
    T = g.shape[0]
    a = torch.cat([rms(embed[tokens], w[p + "input_layernorm.weight"]), rms(g, w[p + "hidden_norm.weight"])], -1)
    q = rope((a @ w[p + "self_attn.q_proj.weight"].T).reshape(T, HEADS, HD), positions)
    k = rope((a @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV_HEADS, HD), positions)
    v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV_HEADS, HD)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)  # q head -> kv head
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(HD)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    attn = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, HEADS * HD)
    x = g + attn @ w[p + "self_attn.o_proj.weight"].T
    y = rms(x, w[p + "post_attention_layernorm.weight"])
    gate, up = y @ w[p + "mlp.gate_proj.weight"].T, y @ w[p + "mlp.up_proj.weight"].T
    x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    draft_logits = rms(x, w["norm.weight"]) @ w["lm_head.weight"].T  # (T, Vd)
    logits = torch.full((T, V), float("-inf"), dtype=torch.float64)
    logits[:, torch.arange(draft_logits.shape[1]) + weights["d2t"]] = draft_logits
    return logits, x


@pytest.fixture(scope="module")
def hidden(target_dir) -> dict[int, torch.Tensor]:
    """transformers' hidden_states rows (m, H) of the prompt but its last token, at EAGLE-3's taps (0 = the
    embeddings, i = the output of decoder layer i - 1); each tap is below the last layer, whose row
    transformers returns normed."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        states = ref(torch.tensor([PROMPT[:-1]]), output_hidden_states=True).hidden_states
    return {t: states[t][0] for t in TAPS}


def fused(weights, hidden) -> torch.Tensor:
    return torch.cat([hidden[t].double() for t in TAPS], -1) @ weights["fc.weight"].double().T  # (T, H)


# -- the checks ---------------------------------------------------------------------------------------------
def test_the_head_reads_the_published_layout_as_the_formula_does(target, hidden, head_dir):
    """Every row of a prompt through the head as the drafter runs it (feature, then one step over the pairs
    (g_j, x_{j+1}) at positions j), then one more step fed back x, against the float64 formula."""
    weights = published_head()
    head = load_eagle3_head(head_dir, target)
    assert head.hidden_layers == TAPS
    embed = target.checkpoint.get("model.embed_tokens.weight").double()
    m = len(PROMPT) - 1
    tokens, positions = torch.tensor(PROMPT[1:]), torch.arange(m)  # pair j: (g_j, x_{j+1}) at position j
    want, x = eagle3_formula(weights, embed, fused(weights, hidden), tokens, positions)
    with torch.no_grad():
        feats = head.feature({t: h[None] for t, h in hidden.items()})  # (1, m, H)
        mask = torch.ones(1, m, m, dtype=torch.bool).tril()
        logits, out, k, v = head.step(0, feats, tokens[None], positions[None], None, None, mask)
    torch.testing.assert_close(feats[0].double(), fused(weights, hidden), rtol=0, atol=1e-5)
    torch.testing.assert_close(out[0].double(), x, rtol=0, atol=1e-4)
    assert torch.equal(torch.isfinite(logits[0]), torch.isfinite(want))  # the draft vocabulary's target ids
    torch.testing.assert_close(logits[0].double(), want, rtol=0, atol=1e-4)
    # the next step: x of the last row fed back in place of g, the token drafted from it, one position on
    drafted = int(want[-1].argmax())
    want2, _ = eagle3_formula(weights, embed, torch.cat([fused(weights, hidden), x[-1:]]),
                              torch.tensor(PROMPT[1:] + [drafted]), torch.arange(m + 1))
    with torch.no_grad():
        logits2, _, _, _ = head.step(0, out[:, -1:], torch.tensor([[drafted]]), torch.tensor([[m]]), k, v,
                                     torch.ones(1, 1, m + 1, dtype=torch.bool))
    torch.testing.assert_close(logits2[0, 0].double(), want2[-1], rtol=0, atol=1e-4)


def formula_chain(weights, embed, hidden, drafted):
    """The formula's logits (n, V) of each drafted position after the prompt: the root row (g_{m-1}, x_m) at
    position m - 1, then each drafted token with the x before it, one position further on."""
    g, tokens = fused(weights, hidden), PROMPT[1:]
    rows = []
    for token in [None, *drafted]:
        if token is not None:
            g, tokens = torch.cat([g, x[-1:]]), tokens + [token]
        logits, x = eagle3_formula(weights, embed, g, torch.tensor(tokens), torch.arange(len(tokens)))
        rows.append(logits[-1])
    return torch.stack(rows)


def drafted_chain(target, head_dir, hidden, sampling):
    drafter = make_eagle3_drafter(target, str(head_dir), max_len=64)
    drafter.begin(PROMPT[:-1], sampling, torch.Generator().manual_seed(0))
    drafter.on_target_hidden(hidden, PROMPT[:-1])  # rows of x_0..x_{m-1}; x_m was just emitted
    return drafter.propose(PROMPT, 4)


def test_the_drafter_proposes_the_formulas_greedy_chain(target, hidden, head_dir):
    """The drafter fed the target's hidden rows of a prompt drafts, greedily, the chain the formula gives."""
    weights = published_head()
    embed = target.checkpoint.get("model.embed_tokens.weight").double()
    chain = list(drafted_chain(target, head_dir, hidden, SamplingParams()).tokens)
    logits = formula_chain(weights, embed, hidden, chain)  # (5, V): the last row drafts past the chain
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1] > 1e-3).all()  # no near tie that float32 could break otherwise
    assert chain == logits[:-1].argmax(-1).tolist()
    assert set(chain) <= set(DRAFT_IDS.tolist())


def test_each_sampled_draft_row_is_the_formulas_distribution(target, hidden, head_dir):
    """Sampled at temperature 1, the drafter hands over each node's distribution: softmax of the formula's
    logits for the chain it drew (a drafted token one position off, or not attending its ancestors, shows
    here where the greedy argmax may not move)."""
    weights = published_head()
    embed = target.checkpoint.get("model.embed_tokens.weight").double()
    draft = drafted_chain(target, head_dir, hidden, SamplingParams(temperature=1.0))
    chain = list(draft.tokens)
    want = formula_chain(weights, embed, hidden, chain)[:-1].softmax(-1)  # (4, V)
    torch.testing.assert_close(draft.draft_probs.double(), want, rtol=0, atol=1e-5)
