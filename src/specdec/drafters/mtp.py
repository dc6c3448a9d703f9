"""draft-mtp: the model's own multi-token-prediction layers draft the next tokens.

Module k (DeepSeek-V3 notation):  h' = eh_proj([RMSNorm_e(embed(t_{i+k})); RMSNorm_h(h_{k-1})]),
then one transformer block, then the shared norm + the target's output head. h_0 is the
target's last hidden state after its final norm (what vLLM and SGLang feed MTP). Several
modules chain (the pair at draft depth d runs module d % K); one module is reused for
longer drafts.

Weights are read in the layouts real checkpoints use (tensor names as in the file):

    deepseek   model.layers.{N+k}.{enorm,hnorm,eh_proj,shared_head.norm}.weight + the block
               (DeepSeek-V3, GLM-4.5; GGUF blk.{N+k}.nextn.* tensors are renamed to these)
    mimo       model.mtp_layers.{k}.{token_layernorm,hidden_layernorm,input_proj,final_layernorm}
               + the block; concatenation order [hidden; embedding], embedding zero at position 0
    qwen3next  mtp.{pre_fc_norm_embedding,pre_fc_norm_hidden,fc,norm}.weight, mtp.layers.{k}.*
               (Qwen3-Next / Qwen3.5: norms and fc shared by the layers)

The block must be a dense layer of the target's family (llama / qwen2 / qwen3 / gemma3; Qwen3.5's: the
gated-attention layer of model/gated_attention.py, whose later steps are fed the normed output in either
layout, as vLLM and llama.cpp run it), or, for a mixture-of-experts target (GLM-4.5's nextn layer, the MTP
layer of Qwen3.5-MoE / Qwen3-Next), that layer with its MLP a mixture (model/moe.py, float32, the target's
MoEConfig); MLA blocks are not something this runtime runs. An MTP head trained by `specdec train mtp` is
saved in the deepseek layout in a folder (config.json + model.safetensors) and found
beside the model (`<model path>.mtp/`) or among the heads shipped with specdec.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from specdec.drafters.base import DEFAULT_DRAFT_LENGTH
from specdec.drafters.gemma4_assistant import make_assistant_drafter
from specdec.drafters.hidden import HiddenHead, HiddenStateDrafter
from specdec.model.checkpoint_facts import sidecar_path
from specdec.model.errors import SpecdecError
from specdec.model.files import read_json_object, replaced, safetensors_names, write_text
from specdec.model.gated_attention import GatedDecoderLayer
from specdec.model.layers import DecoderLayer, RMSNorm, rms_norm
from specdec.model.load import checkpoint_digest
from specdec.model.moe import build_moe

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"
BLOCK_KEYS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
              "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
              "input_layernorm.weight", "post_attention_layernorm.weight")
OPTIONAL_BLOCK_KEYS = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                       "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                       "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight")  # Gemma 3


class MTPError(SpecdecError):
    pass


@dataclass(frozen=True)
class MTPLayout:
    """Where one checkpoint keeps its MTP modules' tensors."""

    name: str  # deepseek, mimo, qwen3next
    prefixes: tuple[str, ...]  # block prefix of each module, in order
    # per module: (enorm, hnorm, eh_proj, norm) tensor names
    stems: tuple[tuple[str, str, str, str], ...]
    embed_first: bool  # concatenation order of the projection input
    feeds_normed: bool  # later steps get the normed output (mimo, qwen3next) or the pre-norm one (deepseek)
    zero_first_embed: bool = False


def find_layout(names, num_layers: int) -> MTPLayout | None:
    """The MTP layout of a checkpoint's tensor names, or None when it has no MTP weights."""
    names = set(names)
    deep = sorted({int(m.group(1)) for n in names if (m := re.fullmatch(r"model\.layers\.(\d+)\.eh_proj\.weight", n))
                   and int(m.group(1)) >= num_layers})
    if deep:
        pre = tuple(f"model.layers.{i}." for i in deep)
        return MTPLayout("deepseek", pre, tuple((p + "enorm.weight", p + "hnorm.weight", p + "eh_proj.weight",
                                                 p + "shared_head.norm.weight") for p in pre), True, False)
    mimo = sorted({int(m.group(1)) for n in names if (m := re.fullmatch(r"model\.mtp_layers\.(\d+)\.input_proj\.weight", n))})
    if mimo:
        pre = tuple(f"model.mtp_layers.{i}." for i in mimo)
        return MTPLayout("mimo", pre, tuple((p + "token_layernorm.weight", p + "hidden_layernorm.weight",
                                             p + "input_proj.weight", p + "final_layernorm.weight") for p in pre),
                         False, True, zero_first_embed=True)
    if "mtp.fc.weight" in names:
        layers = sorted({int(m.group(1)) for n in names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))})
        pre = tuple(f"mtp.layers.{i}." for i in layers)
        stem = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.fc.weight", "mtp.norm.weight")
        return MTPLayout("qwen3next", pre, tuple(stem for _ in pre), True, True)
    return None


class MTPModule(nn.Module):
    def __init__(self, c, embed_first: bool):
        super().__init__()
        H = c.hidden_size
        self.enorm = RMSNorm(H, c.rms_norm_eps)
        self.hnorm = RMSNorm(H, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.input_layernorm = RMSNorm(H, c.rms_norm_eps)  # the block's input norm lives here (checkpoint names)
        # a block like the target's layers (Gemma 3: its four norms and GeGLU; Qwen3.5: its gated attention)
        if c.attn_output_gate:
            self.block = GatedDecoderLayer(H, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                           c.rms_norm_eps, input_norm=False)
        else:
            self.block = DecoderLayer(H, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                      c.rms_norm_eps, qkv_bias=c.qkv_bias, qk_norm=c.qk_norm, input_norm=False,
                                      sandwich_norms=c.sandwich_norms, act=c.mlp_act)
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.embed_first = embed_first


class MTPHead(HiddenHead):
    """K MTP modules on top of a target (its embedding, final norm and output head are shared).

    embed: (V, H) target embedding; lm_head: (M, H) float32 -> (M, V) logits (the target's QLinear
    at inference, a differentiable function while training); target_norm: (H,) final norm weight.
    """

    def __init__(self, config, num_modules: int, embed: torch.Tensor, lm_head, target_norm: torch.Tensor,
                 layout: MTPLayout | None = None, max_positions: int | None = None):
        super().__init__()
        self.config = config
        self.layout = layout or MTPLayout("deepseek", (), (), True, False)
        self.mods = nn.ModuleList(MTPModule(config, self.layout.embed_first) for _ in range(num_modules))
        self.num_modules = num_modules
        self.hidden_layers = (config.num_layers,)
        self.embed = embed
        self.lm_head = lm_head
        self.register_buffer("target_norm", target_norm.float().clone(), persistent=False)
        self.init_rope(config.rotary_dims, config.rope_theta, max_positions or config.context_length,
                       config.rope_freq_factors)

    def module_layer(self, module: int) -> DecoderLayer:
        return self.mods[module].block

    def feature(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        return rms_norm(hidden[self.config.num_layers].float(), self.target_norm, self.config.rms_norm_eps)

    def step(self, module, feats, tokens, positions, past_k, past_v, mask, last_only=False):
        mod = self.mods[module]
        e = self.embed[tokens].to(feats.dtype)  # (B, T, H)
        if self.layout.zero_first_embed:
            e = e * (positions != 0)[..., None]
        pair = [mod.enorm(e), mod.hnorm(feats)]
        x = mod.eh_proj(torch.cat(pair if mod.embed_first else pair[::-1], dim=-1))  # (B, T, H)
        out, k, v = self.run_layer(mod.block, mod.input_layernorm(x), x, positions, past_k, past_v, mask)
        normed = mod.norm(out)
        rows = normed[:, -1:] if last_only else normed
        B, T, H = rows.shape
        logits = self.lm_head(rows.reshape(B * T, H).float()).reshape(B, T, -1)
        return logits, (normed if self.layout.feeds_normed else out), k, v

    # -- weights -----------------------------------------------------------------------------
    def load_from(self, get, layout: MTPLayout, source=None) -> None:
        """Copy tensors from a checkpoint (get(name) -> tensor) in `layout` into the modules; source (names()):
        the checkpoint, where a block's MLP may be a mixture (its router, mlp.gate.weight, present)."""
        names = set(source.names()) if source is not None else set()
        for mod, prefix, (en, hn, eh, norm) in zip(self.mods, layout.prefixes, layout.stems):
            mixture = getattr(self.config, "moe", None) is not None and prefix + "mlp.gate.weight" in names
            if mixture:  # no dense MLP: its weights would only take memory
                mod.block.mlp = nn.Module()
            try:
                state = {"enorm.weight": get(en), "hnorm.weight": get(hn), "eh_proj.weight": get(eh),
                         "norm.weight": get(norm), "input_layernorm.weight": get(prefix + "input_layernorm.weight")}
            except KeyError as exc:
                raise MTPError(f"MTP module {prefix!r} lacks tensor {exc.args[0]}: it is not a whole MTP head") \
                    from None
            for key in BLOCK_KEYS + OPTIONAL_BLOCK_KEYS:
                if key == "input_layernorm.weight" or mixture and key.startswith("mlp."):
                    continue
                try:
                    state["block." + key] = get(prefix + key)
                except KeyError:
                    if key in BLOCK_KEYS:
                        raise MTPError(f"MTP module {prefix!r} lacks tensor {prefix + key}: specdec runs MTP blocks "
                                       "that are llama/qwen2/qwen3/gemma3/Qwen3.5 layers, "
                                       "dense or with the target's mixture MLP") from None
            own = mod.state_dict()
            for k, v in state.items():
                if k in own and tuple(own[k].shape) != tuple(v.shape):
                    raise MTPError(f"MTP tensor {prefix}{k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}")
            missing, unexpected = mod.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
            missing = [m for m in missing if not m.endswith(("bias", "q_norm.weight", "k_norm.weight"))]
            if missing or unexpected:
                raise MTPError(f"MTP module {prefix!r}: missing {missing}, unexpected {unexpected}")
            if mixture:  # decoder_layer runs block.moe in place of the dense MLP
                mod.block.moe = build_moe(source, self.config, prefix, "fp32", mod.block.mlp_norm.detach(),
                                          _shape_checked(get))


    def deepseek_tensors(self) -> dict[str, torch.Tensor]:
        """This head's weights under DeepSeek-V3 names (model.layers.{N+k}.*), as save_mtp_head writes."""
        out = {}
        N = self.config.num_layers
        for k, mod in enumerate(self.mods):
            p = f"model.layers.{N + k}."
            for name, t in mod.state_dict().items():
                if name.startswith("block."):
                    name = name[len("block."):]
                elif name == "norm.weight":
                    name = "shared_head.norm.weight"
                out[p + name] = t.detach().float().contiguous()
        return out


def _shape_checked(get):
    """get(name) -> get(name, shape): float32, its shape checked (build_moe's getter)."""
    def checked(name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        t = get(name).float()
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise MTPError(f"MTP tensor {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        return t

    return checked


def checkpoint_getter(source):
    names = set(source.names())

    def get(name):
        if name not in names:
            raise KeyError(name)
        return source.get(name)

    return get


# -- finding an MTP head for a target ----------------------------------------------------------
def shipped_head(kind: str, model) -> Path | None:
    """A head shipped under specdec/heads/<name>/<kind>/ whose config names this target."""
    if not HEADS_DIR.is_dir():
        return None
    for cfg in sorted(HEADS_DIR.glob(f"*/{kind}/config.json")):
        try:
            target = json.loads(cfg.read_text()).get("specdec", {}).get("target", {})
        except (OSError, json.JSONDecodeError):
            continue
        c = model.config
        shapes = (target.get("hidden_size"), target.get("num_layers"), target.get("vocab_size"))
        if shapes != (c.hidden_size, c.num_layers, c.vocab_size):
            continue
        if model.info.name in target.get("names", []) or model.info.sha256 in target.get("sha256", []):
            return cfg.parent
    return None


def shipped_head_for(kind: str, name: str, path, checkpoint) -> Path | None:
    """shipped_head for a target not built yet (inspect, export-config): its checkpoint's config, the name it
    was asked by and its digest (a file's sha256, a folder's digest)."""
    info = SimpleNamespace(name=name, sha256=checkpoint_digest(path))
    return shipped_head(kind, SimpleNamespace(config=checkpoint.config, info=info))


def mtp_head_mismatch(raw: dict, target_config, target_name: str, folder) -> str | None:
    """Why the MTP head whose config.json is `raw` (as save_mtp_head writes it) cannot serve this
    target, or None. The tensor names hold the target's layer count, so the shapes must all match."""
    target = raw.get("specdec", {}).get("target")
    if not isinstance(target, dict):
        return f"{folder}/config.json names no target (specdec.target); it was not written by `specdec train mtp`"
    for key, have in (("hidden_size", target_config.hidden_size), ("num_layers", target_config.num_layers),
                      ("vocab_size", target_config.vocab_size)):
        if target.get(key) != have:
            return (f"the MTP head {folder} was trained for a target with {key} {target.get(key)!r}; "
                    f"{target_name} has {have}")  # !r: "6" is no 6
    return None


def given_head_source(folder, model) -> tuple[object, str]:
    """The MTP weights in a head folder the user gave (-md), checked against the target; MTPError if unfit."""
    folder = Path(folder)
    cfg = folder / "config.json"
    raw = read_json_object(cfg) if cfg.is_file() else {}
    written = raw.get("specdec")
    if not (isinstance(written, dict) and written.get("kind") == "mtp"):
        raise MTPError(f"{folder} is not an MTP head folder (the config.json and model.safetensors that "
                       "`specdec train mtp --out` writes); draft-mtp reads the model's own MTP layers, a head beside "
                       "the model or one shipped with specdec when -md is left out, and draft-simple drafts with a "
                       "smaller model")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise MTPError(f"the MTP head {folder} has no model.safetensors")
    problem = mtp_head_mismatch(raw, model.config, model.info.name, folder)
    if problem is not None:
        raise MTPError(problem)
    return _SafetensorsSource(weights), f"MTP head {folder}"


def mtp_source(model) -> tuple[object, str] | None:
    """(source with names()/get(), description) of the MTP weights for `model`, or None.

    Looks in the checkpoint itself, then beside the model file, then among shipped heads.
    """
    c = model.config
    if find_layout(model.checkpoint.names(), c.num_layers) is not None:
        return model.checkpoint, "MTP layers in the checkpoint"
    for folder, what in ((sidecar_path(model.info.path), "MTP head beside the model"),
                         (shipped_head("mtp", model), "MTP head shipped with specdec")):
        if folder is not None and (folder / "model.safetensors").is_file():
            return _SafetensorsSource(folder / "model.safetensors"), f"{what} ({folder})"
    return None


class _SafetensorsSource:
    def __init__(self, path: Path):
        self.path = path
        self._names = safetensors_names(path)

    def names(self):
        return self._names

    def get(self, name):
        with safe_open(str(self.path), framework="pt") as f:
            return f.get_tensor(name).float()


def load_mtp_head(model, max_len: int = 4096, folder=None) -> tuple[MTPHead, str]:
    """The MTPHead for a loaded target Model, from head `folder` when given (else mtp_source); MTPError with
    a clear reason when there is none."""
    found = given_head_source(folder, model) if folder is not None else mtp_source(model)
    c = model.config
    if found is None:
        if c.mtp_layers_declared:
            raise MTPError(f"{model.info.name} declares {c.mtp_layers_declared} MTP layer(s) but the file has no MTP "
                           "weights (GGUF conversions often drop them); decode without --spec-type draft-mtp, or train "
                           "a head with `specdec train mtp`")
        raise MTPError(f"{model.info.name} has no MTP layers; train a head with `specdec train mtp`, or use another "
                       "--spec-type")
    source, where = found
    layout = find_layout(source.names(), c.num_layers)
    if layout is None:
        raise MTPError(f"{where}: no MTP tensors in a known layout")
    if c.attn_output_gate:  # Qwen3.5 feeds each step the normed output, its GGUF nextn layout too
        layout = replace(layout, feeds_normed=True)
    tr = model.transformer
    head = MTPHead(c, len(layout.prefixes), tr.embed, tr.lm_head, tr.norm, layout, max_positions=max_len + 64)
    head.load_from(checkpoint_getter(source), layout, source)
    return head.eval(), where


def save_mtp_head(head: MTPHead, folder, target_info: dict) -> Path:
    """Write config.json + model.safetensors (deepseek layout) that load_mtp_head reads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = head.config
    tensors = {k: v.to(torch.bfloat16) for k, v in head.deepseek_tensors().items()}
    with replaced(folder / "model.safetensors") as tmp:  # a run killed here keeps the previous head whole
        save_file(tensors, str(tmp))
    cfg = {"model_type": c.arch, "num_hidden_layers": c.num_layers, "num_nextn_predict_layers": head.num_modules,
           "hidden_size": c.hidden_size, "specdec": {"kind": "mtp", "target": target_info}}
    write_text(folder / "config.json", json.dumps(cfg, indent=2) + "\n")
    return folder


def make_mtp_drafter(model, p_min: float = 0.0, max_len: int = 4096, topk: int = 1,
                     budget: int = DEFAULT_DRAFT_LENGTH, folder=None):
    if model.config.arch == "gemma4":  # its MTP drafter is a separate assistant checkpoint
        return make_assistant_drafter(model, folder, p_min, max_len, topk, budget)
    head, where = load_mtp_head(model, max_len, folder)
    drafter = HiddenStateDrafter(head, "draft-mtp", model.config.vocab_size, topk=topk, budget=budget, p_min=p_min,
                                 max_len=max_len)
    drafter.source_note = where
    return drafter
