"""draft-eagle3: an EAGLE-3 head reads three of the target's hidden layers and drafts a tree.

    g   = fc([h_low; h_mid; h_high])                       (3H -> H), target layers `taps`
    x   = midlayer([RMSNorm_in(embed(token)); RMSNorm_h(g)])  one decoder layer, attention input 2H,
                                                            residual stream g
    logits over the draft vocabulary = lm_head(norm(x));   target id = d + d2t[d]
    later steps feed x (pre-norm) back in place of g.

Taps default to (2, N // 2, N - 3) in transformers' hidden_states indexing (0 = embeddings,
i = output of decoder layer i - 1), which is what EAGLE-3 and vLLM capture: the input of
decoder layers 2, N/2 and N-3. A config key eagle_config.eagle_aux_hidden_state_layer_ids
overrides them (as vLLM reads it).

Published heads switch a few steps of that formula (drafters/eagle_formats.py reads which):
    fc_norm               each tap normed before the concatenation (SpecForge's and speculators' EAGLE-3.1)
    norm_before_fc        one norm over the concatenated taps (speculators; its `input_norm`)
    norm_before_residual  the midlayer's residual stream is RMSNorm_h(g), not g (speculators)
    qwen3 layer           per-head q/k norms in the midlayer (a speculators transformer_layer_config of qwen3)
    feed_normed           the state fed back is norm(x), the one lm_head reads (speculators' norm_output)
    final_norm false      lm_head reads x itself (SpecForge's norm_output: false)

Checkpoint layouts (config.json and tensor names of speculators, SpecForge, SafeAILab EAGLE and specdec's
own, safetensors or EAGLE's pytorch_model.bin): drafters/eagle_formats.py. Tensors, under Eagle3Head's
names: fc.weight, midlayer.{self_attn,mlp}.*, midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}
.weight, norm.weight, lm_head.weight, d2t (int64, draft_vocab_size), t2d (bool, vocab_size), optionally
embed_tokens.weight (else the target's embedding is used), fc_norm.{i}.weight, input_norm.weight.
`specdec train eagle3` writes the speculators format (save_eagle3_head).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from specdec.drafters.base import DEFAULT_DRAFT_LENGTH
from specdec.drafters.eagle_formats import (SPECULATORS, Eagle3Error, eagle12_error, flat_config, is_eagle12,
                                            read_shapes, read_tensors, speculators_config, speculators_name,
                                            weight_files)
from specdec.drafters.hidden import HiddenHead, HiddenStateDrafter
from specdec.drafters.mtp import shipped_head
from specdec.model.config import rope_scaling_of, rope_theta_of, size_problem
from specdec.model.errors import ModelFileError
from specdec.model.files import read_json_object, replaced, write_text
from specdec.model.hf_loader import rope_scaling_factors
from specdec.model.layers import DecoderLayer, RMSNorm
from specdec.sampling.params import is_whole

__all__ = ["Eagle3Config", "Eagle3Error", "Eagle3Head", "check_eagle3_folder", "default_taps", "load_eagle3_head",
           "make_eagle3_drafter", "save_eagle3_head"]


def default_taps(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low / mid / high layers in hidden_states indexing: (2, N // 2, N - 3), each kept within
    0 (the embeddings) .. N for targets of fewer than 5 layers (N - 3 is -1 for N = 2)."""
    return tuple(min(max(t, 0), num_layers) for t in (2, num_layers // 2, num_layers - 3))


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # target vocabulary
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_positions: int = 4096
    target_hidden_size: int | None = None
    taps: tuple[int, ...] = ()
    # config.json's rope_scaling as (key, value) pairs (hashable, as a frozen config should be); plain, linear or
    # llama3 (check_eagle3_folder checks it)
    rope_scaling: tuple[tuple[str, object], ...] | None = None
    # the published variants of the formula (module docstring); the defaults are EAGLE-3's own
    fc_norm: bool = False
    input_norm: bool = False  # norm_before_fc
    norm_before_residual: bool = False
    qk_norm: bool = False
    feed_normed: bool = False
    final_norm: bool = True
    extra: dict = field(default_factory=dict, compare=False)

    @staticmethod
    def from_json(raw: dict, target_layers: int, where="EAGLE-3 head") -> "Eagle3Config":
        """The head a config.json describes, in any published layout (eagle_formats.flat_config)."""
        raw = flat_config(raw, where)
        _refuse_unknown(raw, where)
        H = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        taps = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if taps is not None and (not isinstance(taps, (list, tuple)) or not all(is_whole(t) for t in taps)):
            raise ValueError(f"eagle_aux_hidden_state_layer_ids must be a list of layer numbers, got {taps!r}")
        target_hidden = raw.get("target_hidden_size")
        if target_hidden is not None and not is_whole(target_hidden):
            raise ValueError(f"target_hidden_size must be a whole number, got {target_hidden!r}")
        scaling = rope_scaling_of(raw)
        return Eagle3Config(
            hidden_size=H, num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or H // heads), intermediate_size=int(raw["intermediate_size"]),
            vocab_size=int(raw["vocab_size"]), draft_vocab_size=int(raw.get("draft_vocab_size") or raw["vocab_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope_theta=rope_theta_of(raw, 10000.0),
            max_positions=int(raw.get("max_position_embeddings") or 4096),
            target_hidden_size=target_hidden,
            taps=tuple(int(t) for t in taps) if taps else default_taps(target_layers),
            rope_scaling=tuple(sorted(scaling.items())) if scaling else None,
            fc_norm=bool(raw.get("fc_norm")), input_norm=bool(raw.get("norm_before_fc")),
            norm_before_residual=bool(raw.get("norm_before_residual")), qk_norm=raw.get("model_type") == "qwen3",
            feed_normed=bool(raw.get("feed_normed")), final_norm=raw.get("final_norm", True) is not False,
        )

    def rope_factors(self, where="EAGLE-3 head") -> tuple[float, ...] | None:
        return rope_scaling_factors(where, dict(self.rope_scaling or ()), self.head_dim, self.rope_theta)

    def to_json(self) -> dict:
        """config.json in the flat layout SpecForge and SGLang read (save_eagle3_head writes speculators'); a
        ValueError for a variant only the speculators layout says."""
        only = [k for k in ("norm_before_residual", "input_norm", "qk_norm", "feed_normed") if getattr(self, k)]
        if only:
            raise ValueError(f"the flat EAGLE-3 config.json cannot say {', '.join(only)}: save the speculators layout")
        return {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": self.hidden_size, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": 1, "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "max_position_embeddings": self.max_positions,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.taps)},
            **({"target_hidden_size": self.target_hidden_size} if self.target_hidden_size else {}),
            **({"rope_scaling": dict(self.rope_scaling)} if self.rope_scaling else {}),
            **({"fc_norm": True} if self.fc_norm else {}), **({"norm_output": False} if not self.final_norm else {}),
        }


class Eagle3Head(HiddenHead):
    """The EAGLE-3 head; `embed` is the target's (V, H) embedding unless the checkpoint has its own."""

    def __init__(self, cfg: Eagle3Config, embed: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.hidden_layers = tuple(cfg.taps)
        self.num_modules = 1
        self.fc = nn.Linear(len(cfg.taps) * (cfg.target_hidden_size or H), H, bias=False)
        # its input_layernorm norms the token embedding, hidden_norm the feature: the attention reads both (2H)
        self.midlayer = DecoderLayer(H, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                                     cfg.rms_norm_eps, attn_in=2 * H, qk_norm=cfg.qk_norm)
        width = cfg.target_hidden_size or H  # of each tap
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(width, cfg.rms_norm_eps) for _ in cfg.taps)
        if cfg.input_norm:
            self.input_norm = RMSNorm(len(cfg.taps) * width, cfg.rms_norm_eps)
        self.midlayer.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.embed = embed
        self.init_rope(cfg.head_dim, cfg.rope_theta, max(cfg.max_positions, 8192), cfg.rope_factors())

    def set_vocab_map(self, draft_ids_in_target: torch.Tensor) -> None:
        """draft_ids_in_target: (draft_vocab,) target ids, ascending; sets d2t (offsets) and t2d."""
        ids = draft_ids_in_target.long()
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_to_target(self) -> torch.Tensor:
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t  # (Vd,)

    def module_layer(self, module: int) -> DecoderLayer:
        return self.midlayer

    def feature(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        taps = [hidden[i].float() for i in self.cfg.taps]  # (..., n, H) each
        if self.cfg.fc_norm:
            taps = [norm(t.to(norm.weight.dtype)) for norm, t in zip(self.fc_norm, taps)]
        taps = torch.cat(taps, dim=-1)  # (..., n, 3H)
        if self.cfg.input_norm:
            taps = self.input_norm(taps.to(self.input_norm.weight.dtype))
        return self.fc(taps.to(self.fc.weight.dtype))

    def draft_logits(self, feats, tokens, positions, past_k, past_v, mask, last_only=False):
        """-> (draft-vocab logits (B, T, Vd), or (B, 1, Vd) of the last row if last_only; the state fed back
        (B, T, H): x before the final norm, or after it where feed_normed; k, v)."""
        e = self.embed[tokens].to(feats.dtype)  # (B, T, H)
        m, c = self.midlayer, self.cfg
        g = m.hidden_norm(feats)
        attn_in = torch.cat([m.input_layernorm(e), g], dim=-1)  # (B, T, 2H)
        out, k, v = self.run_layer(m, attn_in, g if c.norm_before_residual else feats, positions, past_k, past_v,
                                   mask)
        if c.feed_normed:
            out = self.norm(out)
        rows = out[:, -1:] if last_only else out
        return self.lm_head(rows if c.feed_normed or not c.final_norm else self.norm(rows)), out, k, v

    def step(self, module, feats, tokens, positions, past_k, past_v, mask, last_only=False):
        logits_d, out, k, v = self.draft_logits(feats, tokens, positions, past_k, past_v, mask, last_only)
        B, T, _ = logits_d.shape
        logits = torch.full((B, T, self.cfg.vocab_size), float("-inf"), dtype=torch.float32, device=logits_d.device)
        logits[..., self.draft_to_target()] = logits_d.float()
        return logits, out, k, v


# -- files -------------------------------------------------------------------------------------
def load_eagle3_head(path, target) -> Eagle3Head:
    """An Eagle3Head from a folder in any published layout (eagle_formats) for a loaded target Model."""
    c = target.config
    cfg, files = check_eagle3_folder(path, c, target.info.name)
    tensors = read_tensors(files)
    embed = tensors.pop("embed_tokens.weight", None)
    head = Eagle3Head(Eagle3Config(**{**cfg.__dict__, "vocab_size": c.vocab_size}),
                      embed if embed is not None else target.transformer.embed)
    state = {k: (v if k in ("d2t", "t2d") else v.float()) for k, v in tensors.items() if k in head.state_dict()}
    if "d2t" not in state:  # the full vocabulary (check_eagle3_folder refuses a reduced one without d2t)
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.int64)
    state["d2t"] = state["d2t"].long()
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    if "t2d" in state:
        n = min(len(state["t2d"]), c.vocab_size)
        t2d[:n] = state["t2d"][:n].bool()
    else:
        t2d[torch.arange(cfg.draft_vocab_size) + state["d2t"]] = True
    state["t2d"] = t2d
    head.load_state_dict(state, strict=False)  # names and shapes checked by check_eagle3_folder
    return head.eval()


# tensors a published head may carry that the head does not read: speculators' training copies of the target's
_UNREAD = ("verifier_norm.weight", "verifier_lm_head.weight")


def check_eagle3_folder(path, target_config, target_name: str) -> tuple[Eagle3Config, list[Path]]:
    """(its config, its weight files) where the folder holds an EAGLE-3 head this target can run, else an
    Eagle3Error saying why. Reads config.json, the tensors' names and shapes, and d2t only, so that `specdec
    inspect` and auto refuse exactly what the loader refuses, without building the head."""
    path, c = Path(path), target_config
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise Eagle3Error(f"{path}: not an EAGLE-3 head folder (no config.json)")
    try:
        raw = read_json_object(cfg_file)
    except ModelFileError as exc:
        raise Eagle3Error(str(exc)) from None
    files = weight_files(path)
    if not files:
        raise Eagle3Error(f"{path}: no weights (*.safetensors, or EAGLE's pytorch_model.bin)")
    shapes = read_shapes(files)
    if is_eagle12(raw, shapes):
        raise eagle12_error(path)
    try:
        cfg = Eagle3Config.from_json(raw, c.num_layers, path)
    except KeyError as exc:
        raise Eagle3Error(f"{cfg_file} lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:  # "yes" as eagle_config; 0 heads
        raise Eagle3Error(f"{cfg_file}: a value of the wrong type or out of range ({type(exc).__name__}: {exc})") \
            from None
    problem = size_problem({"hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_heads,
                            "head_dim": cfg.head_dim, "num_key_value_heads": cfg.num_kv_heads,
                            "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
                            "draft_vocab_size": cfg.draft_vocab_size}, "num_attention_heads", "num_key_value_heads")
    if problem is not None:
        raise Eagle3Error(f"{cfg_file}: {problem}")
    if cfg.vocab_size != c.vocab_size and abs(cfg.vocab_size - c.vocab_size) > 128:
        raise Eagle3Error(f"EAGLE-3 head {path} was trained for a vocabulary of {cfg.vocab_size} tokens; the target "
                          f"{target_name} has {c.vocab_size}: it belongs to another model")
    if (cfg.target_hidden_size or cfg.hidden_size) != c.hidden_size:
        expects = cfg.target_hidden_size or cfg.hidden_size
        raise Eagle3Error(f"EAGLE-3 head {path} expects target hidden size {expects}; the target {target_name} "
                          f"has {c.hidden_size}: it belongs to another model")
    if any(not 0 <= t <= c.num_layers for t in cfg.taps):
        raise Eagle3Error(f"EAGLE-3 head {path} taps layers {cfg.taps}, beyond the target's {c.num_layers} layers")
    try:
        cfg.rope_factors(cfg_file)
    except ModelFileError as exc:  # a scaling type specdec does not compute, or values it cannot read
        raise Eagle3Error(str(exc)) from None
    with torch.device("meta"):
        own = {k: tuple(v.shape) for k, v in
               Eagle3Head(Eagle3Config(**{**cfg.__dict__, "vocab_size": c.vocab_size})).state_dict().items()}
    wrong = [f"{k} {shape} (its config.json implies {own[k]})" for k, shape in shapes.items()
             if k in own and k != "t2d" and shape != own[k]]
    if "t2d" in shapes and len(shapes["t2d"]) != 1:  # of any length (a longer target vocabulary), but a list
        wrong.append(f"t2d {tuple(shapes['t2d'])} (one flag per target token)")
    embed = shapes.get("embed_tokens.weight")  # its own embedding, looked up with every target token id
    if embed is not None and (len(embed) != 2 or embed[1] != cfg.hidden_size or embed[0] < c.vocab_size):
        wrong.append(f"embed_tokens.weight {tuple(embed)} (at least ({c.vocab_size}, {cfg.hidden_size}): a row for "
                     f"every token of the target)")
    if wrong:
        raise Eagle3Error(f"EAGLE-3 head {path}: tensors of the wrong shape: {', '.join(wrong[:3])}")
    if embed is None and cfg.hidden_size != c.hidden_size:  # the target's embedding rows are c.hidden_size wide
        raise Eagle3Error(f"EAGLE-3 head {path} has hidden size {cfg.hidden_size}, the target {target_name} "
                          f"{c.hidden_size}, and no embed_tokens.weight of its own: the target's embedding does not "
                          "fit it")
    if "d2t" not in shapes and cfg.draft_vocab_size != c.vocab_size:
        raise Eagle3Error(f"EAGLE-3 head {path} has a reduced vocabulary but no d2t tensor")
    missing = [k for k in own if k not in shapes and not k.startswith("rope_") and k not in ("d2t", "t2d")]
    unexpected = [k for k in shapes if k not in own and k != "embed_tokens.weight" and k not in _UNREAD]
    if missing or unexpected:
        raise Eagle3Error(f"EAGLE-3 head {path}: missing tensors {missing}, unexpected {unexpected}")
    if "d2t" in shapes:
        ids = torch.arange(cfg.draft_vocab_size) + read_tensors(files, {"d2t"})["d2t"].long()
        if len(ids) and (int(ids.max()) >= c.vocab_size or int(ids.min()) < 0):
            raise Eagle3Error(f"EAGLE-3 head {path}: d2t maps draft ids outside the target vocabulary")
    return cfg, files


def _refuse_unknown(raw: dict, where) -> None:
    """A clear error for a published head whose layer computes what Eagle3Head does not."""
    layers = raw.get("num_hidden_layers", 1)
    if layers not in (1, None):
        raise Eagle3Error(f"{where} has {layers} decoder layers; specdec runs EAGLE-3 heads of one layer")
    if "sliding_attention" in (raw.get("layer_types") or []):
        raise Eagle3Error(f"{where} has a sliding-window layer; specdec runs full-attention EAGLE-3 heads only")
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        raise Eagle3Error(f"{where} has biases in its decoder layer; specdec runs bias-free EAGLE-3 layers only")
    if raw.get("model_type") not in (None, "llama", "qwen3"):
        raise Eagle3Error(f"{where} has a {raw.get('model_type')!r} decoder layer; specdec runs llama and qwen3 "
                          "EAGLE-3 layers")
    act = raw.get("hidden_act") or "silu"
    if act not in ("silu", "swish"):
        raise Eagle3Error(f"{where} uses hidden_act {act!r}; specdec runs EAGLE-3 layers with silu")


def save_eagle3_head(head: Eagle3Head, folder, target_info: dict | None = None, layout: str = SPECULATORS) -> Path:
    """Write config.json + model.safetensors in the speculators format (eagle_formats.speculators_config), which
    vLLM serves, or with layout EAGLE in the flat one SpecForge and SGLang's LlamaForCausalLMEagle3 read
    (Eagle3Config.to_json, midlayer.* names); the loader here reads both back."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in head.state_dict().items():
        if k.startswith("rope_"):
            continue
        t = v.detach().contiguous() if k in ("d2t", "t2d") else v.detach().to(torch.bfloat16).contiguous()
        tensors[speculators_name(k) if layout == SPECULATORS else k] = t
    with replaced(folder / "model.safetensors") as tmp:  # a run killed here keeps the previous head whole
        save_file(tensors, str(tmp))
    cfg = speculators_config(head.cfg, target_info) if layout == SPECULATORS else head.cfg.to_json()
    if target_info:
        cfg["specdec"] = {"kind": "eagle3", "target": target_info}
    write_text(folder / "config.json", json.dumps(cfg, indent=2) + "\n")
    return folder


def make_eagle3_drafter(target, path=None, p_min: float = 0.0, max_len: int = 4096, topk: int = 1,
                        budget: int = DEFAULT_DRAFT_LENGTH) -> HiddenStateDrafter:
    """The EAGLE-3 drafter: `path` (a head folder), or the head shipped for this target."""
    if path is None:
        path = shipped_head("eagle3", target)
        if path is None:
            raise Eagle3Error(f"--spec-type draft-eagle3 needs an EAGLE-3 head for {target.info.name}: pass its folder "
                              "with --model-draft, or train one with `specdec train eagle3`")
    head = load_eagle3_head(path, target)
    drafter = HiddenStateDrafter(head, "draft-eagle3", target.config.vocab_size, topk=topk, budget=budget,
                                 p_min=p_min, max_len=max_len)
    drafter.source_note = f"EAGLE-3 head {path}"
    return drafter
