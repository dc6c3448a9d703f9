"""Drafter folders as their publishers write them load unchanged: EAGLE-3 heads in vLLM's speculators format,
in SpecForge's and in SafeAILab EAGLE's (pytorch_model.bin), DFlash and DSpark folders as z-lab and DeepSpec
write them. The folders' config.json and tensor names come from the publishers' own code
(tests/drafters/data/published, helpers/published.py), never from specdec's writer; the real config.json
files published beside them are read as published.

Each EAGLE-3 layout's switches (fc_norm, norm_before_fc, norm_before_residual, a qwen3 layer, norm_output
in both of its meanings) are checked against a float64 computation of the formula as the publisher's model
code computes it. EAGLE-1/2 heads are named and refused, and a pickle holding more than tensors is refused
without being unpickled.
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch

from helpers.published import EAGLE3_HEADS, PUBLISHED, published_folder, random_tensors, real_config
from helpers.tiny import EAGLE3_DRAFT_IDS as DRAFT_IDS
from helpers.tiny import random_eagle3_head
from specdec.drafters.block.config import BlockConfig, DFlashError
from specdec.drafters.describe import describe_drafter, head_kind
from specdec.drafters.eagle3 import Eagle3Config, Eagle3Error, load_eagle3_head, make_eagle3_drafter, save_eagle3_head
from specdec.drafters.eagle_formats import flat_config, is_eagle12, is_eagle_folder
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine

PROMPT = list(range(5, 40))


def _generate(model, spec: SpecConfig, drafter=None):
    engine = Engine(model, spec, max_len=256, drafter_factory=(lambda name, s: drafter) if drafter else None)
    return engine.generate(PROMPT, max_tokens=30)


# -- EAGLE-3: every layout loads and drafts ------------------------------------------------------------------
@pytest.mark.parametrize("name", EAGLE3_HEADS)
def test_each_published_eagle3_head_loads_drafts_and_keeps_greedy_output(tiny_model, tmp_path, name):
    folder = published_folder(name, tmp_path)
    assert head_kind(folder) == "draft-eagle3"
    d = describe_drafter(folder, tiny_model.checkpoint, tiny_model.tokenizer, "tiny")
    assert (d["kind"], d["compatible"], d["reason"]) == ("draft-eagle3", True, None)
    drafter = make_eagle3_drafter(tiny_model, str(folder), max_len=256)
    drafted = []
    propose = drafter.propose

    def recording(context, k):
        draft = propose(context, k)
        drafted.extend(draft.tokens)
        return draft

    drafter.propose = recording
    plain = _generate(tiny_model, SpecConfig()).token_ids
    result = _generate(tiny_model, SpecConfig(drafters=("draft-eagle3",), draft_n_max=3), drafter)
    assert result.token_ids == plain
    assert result.stats.drafted > 0 and set(drafted) <= set(DRAFT_IDS.tolist())


@pytest.mark.parametrize("name, switches", [
    ("speculators-eagle3", {}),
    ("speculators-eagle3-qwen3", {"qk_norm": True, "norm_before_residual": True}),
    ("speculators-eagle3-fc-norm", {"fc_norm": True, "feed_normed": True}),
    ("speculators-eagle3-norm-before-fc", {"input_norm": True, "norm_before_residual": True}),
    ("specforge-eagle3", {}),
    ("specforge-eagle3.1", {"fc_norm": True}),
    ("eagle-eagle3", {}),
])
def test_the_switches_each_layout_sets_are_read(tiny_model, tmp_path, name, switches):
    cfg = load_eagle3_head(published_folder(name, tmp_path), tiny_model).cfg
    every = ("fc_norm", "input_norm", "norm_before_residual", "qk_norm", "feed_normed")
    assert {k: getattr(cfg, k) for k in every} == {k: switches.get(k, False) for k in every}
    assert cfg.final_norm and cfg.taps == ((0, 1, 2) if name.startswith("speculators") else (2, 1, 0))


# -- the formula in float64, as the publishers' model code computes it ----------------------------------------
def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, positions, theta):
    """x (T, heads, hd) rotated as Llama and Qwen3 rotate it (rotate-half pairs i and i + hd/2)."""
    hd = x.shape[-1]
    angle = positions.double()[:, None] * theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)[None]
    cos, sin = torch.cat([angle.cos()] * 2, -1)[:, None], torch.cat([angle.sin()] * 2, -1)[:, None]
    return x * cos + torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1) * sin


def formula(raw: dict, w: dict, embed, taps, tokens, positions, fed=None):
    """One step of the head over rows (T): taps [(T, H)] or, with `fed`, the state fed back (T, H) in place of
    fc's output. raw: the flat config (eagle_formats.flat_config) whose switches apply. -> (draft logits (T, Vd),
    the state fed on)."""
    w = {k.replace("layers.0.", "midlayer."): v.double() for k, v in w.items() if k not in ("d2t", "t2d")}
    p, T, theta = "midlayer.", len(tokens), float((raw.get("rope_parameters") or {}).get("rope_theta")
                                                   or raw.get("rope_theta") or 10000.0)
    if fed is None:
        h = [rms(t, w[f"fc_norm.{i}.weight"]) if raw.get("fc_norm") else t for i, t in enumerate(taps)]
        h = torch.cat(h, -1)
        g = (rms(h, w["input_norm.weight"]) if raw.get("norm_before_fc") else h) @ w["fc.weight"].T
    else:
        g = fed
    e = w.get("embed_tokens.weight", embed.double())[tokens]
    normed_g = rms(g, w[p + "hidden_norm.weight"])
    a = torch.cat([rms(e, w[p + "input_layernorm.weight"]), normed_g], -1)
    q = (a @ w[p + "self_attn.q_proj.weight"].T).reshape(T, 4, 16)
    k = (a @ w[p + "self_attn.k_proj.weight"].T).reshape(T, 2, 16)
    v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(T, 2, 16)
    if raw.get("model_type") == "qwen3":
        q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
    q, k = rope(q, positions, theta), rope(k, positions, theta)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(16)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    attn = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, 64)
    x = (normed_g if raw.get("norm_before_residual") else g) + attn @ w[p + "self_attn.o_proj.weight"].T
    y = rms(x, w[p + "post_attention_layernorm.weight"])
    x = x + (torch.nn.functional.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T)) \
        @ w[p + "mlp.down_proj.weight"].T
    if raw["layout"] == "speculators" and raw.get("feed_normed"):  # speculators' norm_output
        x = rms(x, w["norm.weight"])
        return x @ w["lm_head.weight"].T, x
    head_in = rms(x, w["norm.weight"]) if raw.get("final_norm", True) else x  # SpecForge's norm_output
    return head_in @ w["lm_head.weight"].T, x


@pytest.mark.parametrize("name, config", [
    ("speculators-eagle3", None), ("speculators-eagle3-qwen3", None), ("speculators-eagle3-fc-norm", None),
    ("speculators-eagle3-norm-before-fc", None), ("specforge-eagle3.1", None),
    # what speculators' trainer now writes by default for eagle3: norm_before_fc and norm_output both on
    ("speculators-eagle3-norm-before-fc", {"norm_output": True}),
    ("specforge-eagle3", {"norm_output": False}), ("eagle-eagle3", None)])
def test_each_layout_computes_its_publishers_formula(tiny_model, tmp_path, name, config):
    """A prompt's rows through the head as the drafter runs them, then one step fed back the state the layout
    feeds back, against the float64 formula with that layout's switches."""
    folder = published_folder(name, tmp_path, config=config)
    raw = flat_config(json.loads((folder / "config.json").read_text()), folder)
    weights = random_tensors(name)
    head = load_eagle3_head(folder, tiny_model)
    embed = tiny_model.checkpoint.get("model.embed_tokens.weight")
    g = torch.Generator().manual_seed(5)
    T = 6
    hidden = {i: torch.randn(T, 64, generator=g) for i in head.cfg.taps}
    taps = [hidden[i].double() for i in head.cfg.taps]
    tokens, positions = torch.tensor(PROMPT[1: T + 1]), torch.arange(T)
    want, fed = formula(raw, weights, embed, taps, tokens, positions)
    with torch.no_grad():
        feats = head.feature({i: h[None] for i, h in hidden.items()})
        logits, out, k, v = head.draft_logits(feats, tokens[None], positions[None], None, None,
                                              torch.ones(1, T, T, dtype=torch.bool).tril())
    torch.testing.assert_close(logits[0].double(), want, rtol=0, atol=2e-4)
    torch.testing.assert_close(out[0].double(), fed, rtol=0, atol=2e-4)
    nxt = int(want[-1].argmax())
    want2, _ = formula(raw, weights, embed, None, torch.tensor(PROMPT[1: T + 1] + [nxt]), torch.arange(T + 1),
                       fed=torch.cat([fc_output(raw, weights, taps), fed[-1:]]))
    with torch.no_grad():
        logits2, *_ = head.draft_logits(out[:, -1:], torch.tensor([[nxt]]), torch.tensor([[T]]), k, v,
                                        torch.ones(1, 1, T + 1, dtype=torch.bool))
    torch.testing.assert_close(logits2[0, 0].double(), want2[-1], rtol=0, atol=2e-4)


def fc_output(raw, weights, taps):
    """fc's output for the prompt rows (what the rows before the fed-back one carry)."""
    w = {k: v.double() for k, v in weights.items() if k not in ("d2t", "t2d")}
    h = torch.cat([rms(t, w[f"fc_norm.{i}.weight"]) if raw.get("fc_norm") else t for i, t in enumerate(taps)], -1)
    return (rms(h, w["input_norm.weight"]) if raw.get("norm_before_fc") else h) @ w["fc.weight"].T


# -- EAGLE-1/2: named, refused ------------------------------------------------------------------------------
def test_an_eagle12_head_is_named_and_refused_everywhere(tiny_model, tmp_path):
    """SafeAILab's EAGLE-1/2 head (LlamaForCausalLM config, pytorch_model.bin with fc over 2H and layers.0.*)
    was taken for a plain model or an EAGLE-3 head; each path names it now."""
    folder = published_folder("eagle-eagle1", tmp_path)
    assert head_kind(folder) == "draft-eagle3"  # the nearest kind specdec has: it says why it cannot run it
    with pytest.raises(Eagle3Error, match=r"is an EAGLE-1/2 head .*: specdec runs EAGLE-3 heads"):
        load_eagle3_head(folder, tiny_model)
    d = describe_drafter(folder, tiny_model.checkpoint, tiny_model.tokenizer, "tiny")
    assert d["kind"] == "draft-eagle3" and not d["compatible"] and "EAGLE-1/2 head" in d["reason"]
    with pytest.raises(Eagle3Error, match="EAGLE-1/2 head"):
        Engine(tiny_model, SpecConfig(drafters=("draft-eagle3",), draft_model=str(folder)), max_len=64).generate(
            PROMPT[:5], max_tokens=2)
    speculators = published_folder("speculators-eagle3", tmp_path / "s", config={"speculators_model_type": "eagle"})
    with pytest.raises(Eagle3Error, match="EAGLE-1/2 head"):
        load_eagle3_head(speculators, tiny_model)


def test_real_eagle_configs_are_told_apart():
    """The config.json files SafeAILab EAGLE publishes, as published: its EAGLE-3 heads say LlamaForCausalLM
    and a draft vocabulary; its EAGLE-1/2 heads LlamaForCausalLM alone, with an fc over 2H among the tensors."""
    eagle3, eagle1 = real_config("eagle-eagle3-llama3.1-8b.json"), real_config("eagle-eagle1-llama2-chat-7b.json")
    h = eagle1["hidden_size"]
    eagle1_tensors = {"fc.weight": (h, 2 * h), "fc.bias": (h,), "layers.0.self_attn.q_proj.weight": (h, h)}
    eagle3_tensors = {"fc.weight": (4096, 3 * 4096), "midlayer.self_attn.q_proj.weight": (4096, 8192)}
    assert is_eagle12(eagle1, eagle1_tensors) and not is_eagle12(eagle3, eagle3_tensors)
    cfg = Eagle3Config.from_json(eagle3, 32)
    assert (cfg.hidden_size, cfg.num_kv_heads, cfg.draft_vocab_size, cfg.vocab_size, cfg.taps) == \
        (4096, 8, 32000, 128256, (2, 16, 29))
    assert is_eagle_folder(eagle3, None)  # a draft vocabulary: an EAGLE head whatever its architectures say


# -- pickles --------------------------------------------------------------------------------------------------
class Payload:
    """An object a pickle would build: unpickling it runs pathlib.Path.touch on a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def test_a_pickle_holding_more_than_tensors_is_refused_and_never_run(tiny_model, tmp_path):
    folder = published_folder("eagle-eagle3", tmp_path)
    tensors = torch.load(folder / "pytorch_model.bin", weights_only=True)
    marker = tmp_path / "unpickled"
    torch.save({**tensors, "extra": Payload(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(Eagle3Error, match=r"pytorch_model.bin: refused: this pickle holds more than tensors .*"
                                          r"specdec never unpickles objects"):
        load_eagle3_head(folder, tiny_model)
    d = describe_drafter(folder, tiny_model.checkpoint, tiny_model.tokenizer, "tiny")
    assert not d["compatible"] and "refused" in d["reason"]
    assert not marker.exists()


# -- specdec writes the speculators format --------------------------------------------------------------------
def test_specdec_writes_what_speculators_writes(tiny_model, tmp_path):
    """save_eagle3_head (what `specdec train eagle3` writes) gives the keys speculators' own Eagle3DraftModel
    writes, the structure vLLM's SpeculatorsConfig requires, the tensor names speculators saves (less the
    embedding, which vLLM and speculators take from the target), and loads back as it was."""
    head = random_eagle3_head(tiny_model)
    info = {"names": ["tiny"], "arch": "llama"}
    folder = save_eagle3_head(head, tmp_path / "mine", info)
    ours = json.loads((folder / "config.json").read_text())
    theirs = json.loads((PUBLISHED / "speculators-eagle3" / "config.json").read_text())
    assert set(theirs) - {"auto_map", "transformers_version"} <= set(ours)
    layer_keys = {"model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim",
                  "num_attention_heads", "num_key_value_heads", "hidden_act", "rms_norm_eps", "rope_parameters",
                  "max_position_embeddings"}
    assert layer_keys <= set(ours["transformer_layer_config"]) & set(theirs["transformer_layer_config"])
    spec = ours["speculators_config"]  # what vLLM's validate_speculators_config reads
    assert spec["proposal_methods"][0]["speculative_tokens"] >= 1 and spec["verifier"]["name_or_path"] == "tiny"
    assert ours["speculators_model_type"] == "eagle3" and ours["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    published = set(json.loads((PUBLISHED / "speculators-eagle3" / "tensors.json").read_text()))
    assert published - names == {"embed_tokens.weight"} and names <= published
    loaded = load_eagle3_head(folder, tiny_model)
    assert loaded.cfg == head.cfg
    for key, tensor in head.state_dict().items():
        if not key.startswith("rope_"):
            want = tensor if key in ("d2t", "t2d") else tensor.to(torch.bfloat16).float()
            assert torch.equal(loaded.state_dict()[key], want), key


# -- DFlash and DSpark as z-lab and DeepSpec write them -------------------------------------------------------
@pytest.mark.parametrize("name, kind", [("zlab-dflash", "draft-dflash"), ("deepspec-dspark", "draft-dspark")])
def test_block_drafters_as_published_draft_and_keep_greedy_output(tiny_model, tmp_path, name, kind):
    folder = published_folder(name, tmp_path)
    assert head_kind(folder) == kind
    plain = _generate(tiny_model, SpecConfig()).token_ids
    result = _generate(tiny_model, SpecConfig(drafters=(kind,), draft_model=str(folder), draft_n_max=3))
    assert result.token_ids == plain and result.stats.drafted > 0


def test_real_block_drafter_configs_are_read_as_published():
    dflash = BlockConfig.from_json(real_config("specforge-qwen3-8b-dflash.json"))
    assert (dflash.layout, dflash.target_layer_ids, dflash.block_size, dflash.mask_token_id, dflash.num_target_layers,
            dflash.hidden_size, dflash.num_layers) == ("dflash", (1, 9, 17, 25, 33), 16, 151669, 36, 4096, 5)
    with pytest.raises(DFlashError, match="is a DSparkDraftModel drafter; specdec runs the Qwen3 DSpark backbone"):
        BlockConfig.from_json(real_config("specforge-qwen3-8b-dspark.json"))


def test_real_specforge_eagle3_configs_are_read_as_published(tiny_model, tmp_path):
    """SpecForge's configs as published (flat sizes, LlamaForCausalLMEagle3); one for another model is refused
    with the reason, not a traceback."""
    cfg = Eagle3Config.from_json(real_config("specforge-qwen3-8b-eagle3.json"), 36)
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size,
            cfg.draft_vocab_size, cfg.rope_theta, cfg.taps) == (4096, 32, 8, 128, 12288, 151936, 32000, 1e6,
                                                                 (2, 18, 33))
    one = Eagle3Config.from_json(real_config("specforge-qwen3-30B-A3B-eagle3.1.json"), 48)
    assert one.fc_norm and one.final_norm and not one.feed_normed
    folder = published_folder("specforge-eagle3", tmp_path)
    (folder / "config.json").write_text(json.dumps(real_config("specforge-qwen3-8b-eagle3.json")))
    d = describe_drafter(folder, tiny_model.checkpoint, tiny_model.tokenizer, "tiny")
    assert not d["compatible"] and "trained for a vocabulary of 151936 tokens" in d["reason"]
