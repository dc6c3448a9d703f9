"""draft-dflash and draft-dspark: a few decoder layers that propose a whole block in one forward.

    context  c_j = hidden_norm(fc([h_l1(x_j); ...; h_lk(x_j)]))   target hidden rows of each committed x_j
    block    [x_m, MASK, ..., MASK]: B rows at positions m .. m+B-1, embedded with the TARGET's embedding
    layers   Qwen3 decoder layers (q_norm / k_norm). Attention keys and values: every context row
             (k_norm(k_proj(c_j)), v_proj(c_j) at position j; no input norm, the same c_j in every layer),
             then the whole block, with no causal mask: each block row sees the context and the block
    logits   the TARGET's lm_head(norm(x)) (no embedding or output head of the drafter's own)

Two published layouts share this backbone (`BlockConfig.layout`):

  dflash  z-lab/dflash, architectures ["DFlashDraftModel"]: row i >= 1 (a MASK at position m+i) predicts
          the token at m+i itself; the anchor row's output is dropped: B - 1 drafts, each sampled from its
          own row (rows are independent given the context).
  dspark  deepseek-ai/DeepSpec, ["Qwen3DSparkModel"]: "anchor-first", row i predicts the token AFTER it
          (position m+i+1), so the anchor row drafts too: B drafts. Tokens are drawn left to right with a
          low-rank Markov bias indexed by the previous token (vanilla: markov_w2(markov_w1[prev]); gated
          and rnn variants as published), and a confidence head sigmoid(proj([h_i; markov_w1[prev]]))
          ends the block at the first position below --spec-draft-p-min. DeepSpec's own "DFlash"
          checkpoints are this layout with markov_rank 0 and no confidence head.

Layer ids: target_layer_ids count decoder layers from 0 ("the output of layer i"); both published
implementations read transformers' hidden_states[i + 1] (DSpark allows -1: the embeddings). specdec's
hidden_layers use transformers' indices, so hidden_layers = ids + 1. transformers' entry N (the last
layer) is the final-NORMED state while the engine hands over the pre-norm one, so the target's final
norm is applied here for index N.

Cache: K/V of context rows only, one slot per committed token (slot = position). The block's own
K/V are computed in the forward and never kept: the published "crop the draft cache to the
accepted length" with nothing to crop. The engine's on_target_hidden hands over the rows of the
tokens it committed (the last verified token and the accepted drafts); they join the cache at the
next proposal.

Files (Hugging Face layout; tensor names as published, read and written by load/save below):
  config.json  dflash: Qwen3 sizes (hidden_size = the target's; num_hidden_layers = the drafter's),
               dflash_config {target_layer_ids, mask_token_id[, block_size]}, block_size at the top level
               or in dflash_config, num_target_layers. dspark: the same sizes; target_layer_ids,
               mask_token_id, block_size, num_anchors, markov_rank, markov_head_type,
               enable_confidence_head, confidence_head_with_markov at the top level.
  *.safetensors  fc.weight (H, k*H), hidden_norm.weight, norm.weight,
               layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
               layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.{input,post_attention}_layernorm.weight;
               dspark adds markov_head.markov_w1.weight (V, r), markov_head.markov_w2.weight (V, r)
               [gated: markov_head.gate_proj.*; rnn: markov_head.joint_proj.*], confidence_head.proj.{weight,bias},
               and embed_tokens.weight / lm_head.weight: frozen copies of the target's, checked for
               their vocabulary and otherwise unused (the target's own are used).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from specdec.drafters.base import Draft, DrafterBase
from specdec.drafters.hidden import HeadCache
from specdec.model.config import llama3_rope_factors, rope_scaling_of, rope_theta_of, size_problem
from specdec.model.errors import SpecdecError
from specdec.model.files import replaced, write_text
from specdec.model.layers import (DecoderLayer, MaskedAttention, RMSNorm, apply_rope, rms_norm, rope_rows, rope_tables,
                                  softcap)
from specdec.sampling import SamplingParams, is_whole, process_logits, sample_token

MAX_VOCAB_PADDING = 128  # as draft_model.MAX_VOCAB_PADDING: embedding rows padded past the tokenizer
MARKOV_KINDS = ("vanilla", "gated", "rnn")
_SKIPPED = ("embed_tokens.weight", "lm_head.weight")  # DSpark's frozen copies of the target's


class DFlashError(SpecdecError):
    pass


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash's choice when a config names none (z-lab's build_target_layer_ids, SGLang's too; DeepSpec's
    Qwen3-4B configs give the same [1, 9, 17, 25, 33]): one id per drafter layer, spread from 1 to N - 3;
    a single layer reads N // 2."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, max(1, num_target_layers - 3)
    return tuple(round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers))


@dataclass(frozen=True)
class BlockConfig:
    """A DFlash / DSpark drafter's settings, as its config.json gives them."""

    layout: str  # "dflash" or "dspark" (see the module docstring)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int | None
    block_size: int
    num_target_layers: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict | None = None
    max_positions: int = 40960
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    markov_rank: int = 0
    markov_head_type: str | None = None
    confidence_head: bool = False
    confidence_with_markov: bool = False
    num_anchors: int | None = None  # DSpark training setting, kept for the round trip

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """transformers' hidden_states indices of target_layer_ids (id + 1; -1 = the embeddings)."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @property
    def next_token(self) -> bool:
        """Each block row predicts the token after it (DSpark), not its own (DFlash)."""
        return self.layout == "dspark"

    @property
    def drafts_per_block(self) -> int:
        return self.block_size if self.next_token else self.block_size - 1

    def rope_factors(self):
        if not self.rope_scaling:
            return None
        return llama3_rope_factors(self.head_dim, self.rope_theta, self.rope_scaling)

    # -- config.json -------------------------------------------------------------------------
    @staticmethod
    def from_json(raw: dict, where: str = "drafter") -> "BlockConfig":
        """The settings in a config.json; DFlashError naming `where` for what specdec cannot run, for a key it
        lacks, and for a value of the wrong type."""
        try:
            cfg = BlockConfig._from_json(raw, where)
        except KeyError as exc:
            raise DFlashError(f"{where}: config.json lacks {exc.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:  # 0 heads: no head_dim
            raise DFlashError(f"{where}: config.json has a value of the wrong type or out of range "
                              f"({type(exc).__name__}: {exc})") from None
        problem = size_problem({"hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
                                "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
                                "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size,
                                "vocab_size": cfg.vocab_size}, "num_attention_heads", "num_key_value_heads")
        if problem is not None:
            raise DFlashError(f"{where}: config.json's {problem}")
        return cfg

    @staticmethod
    def _from_json(raw: dict, where: str) -> "BlockConfig":
        arch = " ".join(str(a) for a in raw.get("architectures") or [])
        if "DFlash2" in arch:
            raise DFlashError(f"{where} is a DFlash2 drafter (causal convolutions and a candidate selector); "
                              "specdec runs DFlashDraftModel and Qwen3DSparkModel drafters only")
        if "DSpark" in arch:
            if "Qwen3DSpark" not in arch:
                raise DFlashError(f"{where} is a {arch} drafter; specdec runs the Qwen3 DSpark backbone only")
            layout, extra = "dspark", raw
        elif "DFlash" in arch or raw.get("dflash_config"):
            layout, extra = "dflash", {**raw, **(raw.get("dflash_config") or {})}  # dflash_config wins
        else:
            raise DFlashError(f"{where} is not a DFlash or DSpark drafter "
                              f"(config.json architectures: {arch or 'none'})")
        if raw.get("attention_bias"):
            raise DFlashError(f"{where} has attention biases; specdec runs bias-free (Qwen3-style) drafter layers only")
        if raw.get("is_causal") or "sliding_attention" in (raw.get("layer_types") or []):
            raise DFlashError(f"{where} has causal or sliding-window drafter layers; specdec runs the published "
                              "full-attention block drafter only")
        ids = extra.get("target_layer_ids")
        if not ids and layout == "dflash" and extra.get("num_target_layers"):  # z-lab's and SGLang's default
            ids = default_target_layers(int(extra["num_target_layers"]), int(raw["num_hidden_layers"]))
        if not ids:
            raise DFlashError(f"{where} names no target_layer_ids (dflash_config.target_layer_ids) and no "
                              "num_target_layers to derive them from: the target layers it reads are unknown")
        if not isinstance(ids, (list, tuple)) or not all(is_whole(i) for i in ids):  # "13" read as layers 1 and 3
            raise DFlashError(f"{where}: target_layer_ids must be a list of layer numbers, got {ids!r}")
        mask = extra.get("mask_token_id")
        if mask is not None and (not is_whole(mask) or mask < 0):
            raise DFlashError(f"{where}: mask_token_id must be a token id, got {mask!r}")
        block = extra.get("block_size")
        if not is_whole(block) or block < 2:  # 3.7 was read as 3
            raise DFlashError(f"{where}: block_size must be at least 2, got {block!r}")
        scaling = rope_scaling_of(raw)
        rope_type = scaling and (scaling.get("rope_type") or scaling.get("type"))
        if scaling is not None and rope_type != "llama3":
            raise DFlashError(f"{where} uses {rope_type!r} RoPE scaling; specdec runs plain and llama3 RoPE only")
        rank = extra.get("markov_rank") or 0
        if not is_whole(rank) or rank < 0:  # -4 was a torch error building the head, 8.7 read as 8
            raise DFlashError(f"{where}: markov_rank must be a whole number of at least 0, got {rank!r}")
        markov = str(extra.get("markov_head_type") or "vanilla").lower() if rank else None
        if markov is not None and markov not in MARKOV_KINDS:
            raise DFlashError(f"{where}: markov_head_type {markov!r} is not one of {', '.join(MARKOV_KINDS)}")
        confidence = bool(extra.get("enable_confidence_head"))
        with_markov = confidence and bool(extra.get("confidence_head_with_markov"))
        if with_markov and not rank:
            raise DFlashError(f"{where}: confidence_head_with_markov needs a Markov head (markov_rank > 0)")
        H, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        softcap = extra.get("final_logit_softcapping")
        cfg = BlockConfig(
            layout=layout, hidden_size=H, num_layers=int(raw["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads), head_dim=int(raw.get("head_dim") or H // heads),
            intermediate_size=int(raw["intermediate_size"]), vocab_size=int(raw["vocab_size"]),
            target_layer_ids=tuple(int(i) for i in ids), mask_token_id=mask, block_size=int(block),
            num_target_layers=int(extra["num_target_layers"]) if extra.get("num_target_layers") else None,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta_of(raw, 1_000_000.0),
            rope_scaling=scaling,
            max_positions=int(raw.get("max_position_embeddings") or 40960),
            input_embedding_scale=float(extra.get("input_embedding_scale", 1.0)),
            output_multiplier=float(extra.get("output_multiplier", 1.0)),
            final_logit_softcapping=float(softcap) if softcap else None,
            markov_rank=rank, markov_head_type=markov, confidence_head=confidence, confidence_with_markov=with_markov,
            num_anchors=int(extra["num_anchors"]) if extra.get("num_anchors") else None)
        cfg.rope_factors()  # llama3 scaling's values read now (a missing factor is from_json's ValueError)
        return cfg

    def to_json(self) -> dict:
        """config.json in this layout's published form (from_json reads it back to an equal config)."""
        out: dict[str, Any] = {
            "model_type": "qwen3", "hidden_act": "silu", "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_positions, "attention_bias": False, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "block_size": self.block_size,
        }
        if self.rope_scaling:
            out["rope_scaling"] = dict(self.rope_scaling)
        if self.num_target_layers:
            out["num_target_layers"] = self.num_target_layers
        settings: dict[str, Any] = {"target_layer_ids": list(self.target_layer_ids)}
        if self.mask_token_id is not None:
            settings["mask_token_id"] = self.mask_token_id
        if self.layout == "dflash":
            for key, default in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0)):
                if getattr(self, key) != default:
                    settings[key] = getattr(self, key)
            if self.final_logit_softcapping:
                settings["final_logit_softcapping"] = self.final_logit_softcapping
            return {"architectures": ["DFlashDraftModel"], **out,
                    "dflash_config": {**settings, "block_size": self.block_size}}
        settings.update(markov_rank=self.markov_rank, enable_confidence_head=self.confidence_head,
                        layer_types=["full_attention"] * self.num_layers)
        if self.markov_rank:
            settings["markov_head_type"] = self.markov_head_type
        if self.confidence_head:
            settings["confidence_head_with_markov"] = self.confidence_with_markov
        if self.num_anchors:
            settings["num_anchors"] = self.num_anchors
        return {"architectures": ["Qwen3DSparkModel"], **out, **settings}


def fit_problem(cfg: BlockConfig, target_config, target_name: str = "the target", where: str = "the drafter",
                embed_rows: int | None = None) -> str | None:
    """Why a drafter with these settings cannot serve this target (None: it can). target_config: a ModelConfig."""
    c = target_config
    if abs(cfg.vocab_size - c.vocab_size) > MAX_VOCAB_PADDING:
        return (f"{where} was trained for a vocabulary of {cfg.vocab_size} tokens; {target_name} has {c.vocab_size}: "
                "it belongs to another model")
    if cfg.hidden_size != c.hidden_size:
        return (f"{where} expects target hidden size {cfg.hidden_size}; {target_name} has {c.hidden_size}: "
                "it belongs to another model")
    if cfg.num_target_layers and cfg.num_target_layers != c.num_layers:
        return (f"{where} was trained on a target with {cfg.num_target_layers} layers; {target_name} has "
                f"{c.num_layers}: it belongs to another model")
    bad = [i for i in cfg.target_layer_ids if not -1 <= i < c.num_layers]
    if bad:
        return (f"{where} reads target layers {list(cfg.target_layer_ids)}, beyond {target_name}'s {c.num_layers} "
                f"layers (ids count from 0; -1 is the embeddings)")
    if cfg.mask_token_id is None:
        return (f"{where} has no mask_token_id (dflash_config.mask_token_id): the block's MASK token is unknown; "
                "add the id the drafter was trained with to its config.json")
    rows = embed_rows or c.vocab_size
    if cfg.mask_token_id >= rows:
        return f"{where}'s mask_token_id {cfg.mask_token_id} is outside {target_name}'s embedding ({rows} rows)"
    return None


# -- the network -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TargetParts:
    """What the drafter borrows from its target.

    embed: (V, H) embedding; lm_head(x (N, H) float32) -> (N, V) logits (a QLinear at inference, any
    differentiable function while training); norm: (H,) final norm weight (for hidden index N); eps.
    """

    embed: torch.Tensor
    lm_head: Callable[[torch.Tensor], torch.Tensor]
    norm: torch.Tensor
    eps: float
    num_layers: int

    @staticmethod
    def of(model) -> "TargetParts":
        tr = model.transformer
        return TargetParts(tr.embed, tr.lm_head, tr.norm, model.config.rms_norm_eps, model.config.num_layers)


class MarkovHead(nn.Module):
    """DSpark's bias on the logits of block row i from the previous token (anchor, then the drafted ones).

    vanilla: markov_w2(markov_w1[prev]); gated: markov_w2(sigmoid(gate_proj([h; w1[prev]])) * w1[prev]);
    rnn: a GRU-like state over the block: joint_proj([s; w1[prev]; h]) -> gate, candidate, output.
    """

    def __init__(self, kind: str, vocab: int, rank: int, hidden: int):
        super().__init__()
        self.kind, self.rank = kind, rank
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def step(self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """prev (n,) ids, h (n, H) block rows -> (bias (n, V), the rnn state (n, r) or None)."""
        e = self.markov_w1(prev)  # (n, r)
        if self.kind == "vanilla":
            return self.markov_w2(e), state
        if self.kind == "gated":
            return self.markov_w2(torch.sigmoid(self.gate_proj(torch.cat([h, e], -1))) * e), state
        state = torch.zeros_like(e) if state is None else state
        gate, candidate, output = self.joint_proj(torch.cat([state, e, h], -1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1 - gate) * torch.tanh(candidate)
        return self.markov_w2(torch.tanh(output)), state


class ConfidenceHead(nn.Module):
    """DSpark's acceptance predictor: a logit per block row (sigmoid = P(the row's draft is accepted))."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class BlockDraftModel(nn.Module):
    """The drafter's own weights (state dict = the published tensor names) over borrowed target parts."""

    def __init__(self, cfg: BlockConfig, target: TargetParts, max_positions: int = 4096):
        super().__init__()
        self.cfg = cfg
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layers = nn.ModuleList(DecoderLayer(H, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                                 cfg.intermediate_size, eps, qk_norm=True)
                                    for _ in range(cfg.num_layers))
        self.norm = RMSNorm(H, eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, eps)
        if cfg.markov_rank:
            self.markov_head = MarkovHead(cfg.markov_head_type, cfg.vocab_size, cfg.markov_rank, H)
        if cfg.confidence_head:
            self.confidence_head = ConfidenceHead(H + (cfg.markov_rank if cfg.confidence_with_markov else 0))
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, max_positions, cfg.rope_factors())
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._target = (target,)  # a tuple: not a submodule, not in the state dict

    @property
    def target(self) -> TargetParts:
        return self._target[0]

    def context(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """Target hidden rows {hidden index: (..., n, H)} -> context rows (..., n, H)."""
        t = self.target
        rows = [rms_norm(hidden[i].float(), t.norm.float(), t.eps) if i == t.num_layers else hidden[i].float()
                for i in self.cfg.hidden_layers]
        return self.hidden_norm(self.fc(torch.cat(rows, dim=-1)))

    def context_kv(self, layer: DecoderLayer, ctx: torch.Tensor, positions: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Context rows (B, n, H) at positions (B, n) -> one layer's keys, values (B, nkv, n, hd)."""
        B, n, _ = ctx.shape
        nkv, hd = layer.kv_heads, layer.head_dim
        k = rms_norm(layer.self_attn.k_proj(ctx).reshape(B * n, nkv, hd), layer.k_norm, layer.eps)
        cos, sin = rope_rows(self.rope_cos, self.rope_sin, positions)
        k = apply_rope(k, cos, sin)
        v = layer.self_attn.v_proj(ctx).reshape(B * n, nkv, hd)
        return k.view(B, n, nkv, hd).transpose(1, 2), v.view(B, n, nkv, hd).transpose(1, 2)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, H) float32 block rows."""
        return self.target.embed[tokens].float() * self.cfg.input_embedding_scale

    def blocks(self, x: torch.Tensor, positions: torch.Tensor, past: Sequence[tuple[torch.Tensor, torch.Tensor]],
               mask: torch.Tensor) -> torch.Tensor:
        """Block rows x (B, T, H) at positions (B, T) through every layer -> normed (B, T, H).

        past: per layer (keys, values) (B, nkv, P, hd) of the context rows; mask (B or 1, T, P + T), True = may
        attend (inference: all True; training: context strictly before the anchor, the own block)."""
        B, T, H = x.shape
        cos, sin = rope_rows(self.rope_cos, self.rope_sin, positions)
        h = x.reshape(B * T, H)
        for layer, (pk, pv) in zip(self.layers, past):
            h = layer(h, MaskedAttention(B, pk, pv, mask), cos, sin)
        return self.norm(h).view(B, T, H)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Block outputs (N, H) -> target-vocabulary logits (N, V) float32, before any Markov bias."""
        return softcap(self.target.lm_head(h.float()) * self.cfg.output_multiplier, self.cfg.final_logit_softcapping)

    def confidence(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """(n, H) rows and (n,) previous tokens -> (n,) acceptance logits."""
        features = h
        if self.cfg.confidence_with_markov:
            features = torch.cat([h, self.markov_head.markov_w1(prev).to(h.dtype)], dim=-1)
        return self.confidence_head(features)


# -- the drafter ---------------------------------------------------------------------------------
class BlockDrafter(DrafterBase):
    """A Drafter around a BlockDraftModel: one forward per proposal, a chain of up to the block's drafts.

    p_min > 0 needs a confidence head (DSpark): the block ends at the first row whose predicted
    acceptance is below it.
    """

    cost_per_pass = True  # one forward per proposal, whatever is used of its block

    def __init__(self, model: BlockDraftModel, name: str, target_vocab: int, p_min: float = 0.0,
                 max_len: int = 4096, source: str = "this drafter"):
        if p_min > 0 and not model.cfg.confidence_head:
            raise DFlashError(f"--spec-draft-p-min {p_min} needs a drafter with a confidence head (DSpark); "
                              f"{source} has none: drop --spec-draft-p-min")
        self.name = name
        self.model = model.eval()
        self.hidden_layers = model.cfg.hidden_layers
        self.target_vocab, self.p_min, self.max_len = target_vocab, p_min, max_len
        layer0 = model.layers[0]
        self.caches = [HeadCache(layer0.kv_heads, layer0.head_dim, max_len) for _ in model.layers]
        self.source_note = source
        self.begin([])

    def begin(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(),
              generator: torch.Generator | None = None) -> None:
        self.sampling, self.generator = sampling, generator or torch.Generator()
        self.fed: list[int] = []  # committed tokens whose target hidden rows arrived: x_0 .. x_{m-1}
        self.pending: list[torch.Tensor] = []  # their context rows not yet in the cache
        for c in self.caches:
            c.length = 0

    @torch.inference_mode()
    def on_target_hidden(self, hidden: dict[int, torch.Tensor], tokens: Sequence[int]) -> None:
        """hidden: {layer: (n, H)} rows of the n tokens just committed to the target."""
        self.pending.append(self.model.context(hidden))
        self.fed.extend(int(t) for t in tokens)

    @torch.inference_mode()
    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        m, cfg = len(self.fed), self.model.cfg
        if draft_length <= 0 or m == 0 or len(context) != m + 1 or m + cfg.block_size > self.max_len:
            return Draft()
        self._catch_up()
        h = self.block_outputs(int(context[m]), m)  # (B, H)
        rows = (h if cfg.next_token else h[1:])[:draft_length]  # row i drafts the token at m + 1 + i
        return self._draft(rows, int(context[m]))

    def block_outputs(self, last: int, m: int) -> torch.Tensor:
        """The normed block rows (B, H) for [last, MASK x (B-1)] at positions m .. m+B-1 over cached context 0..m-1."""
        cfg = self.model.cfg
        B = cfg.block_size
        tokens = torch.tensor([[last] + [cfg.mask_token_id] * (B - 1)])
        past = [(c.k[None, :, :m], c.v[None, :, :m]) for c in self.caches]
        mask = torch.ones(1, B, m + B, dtype=torch.bool)  # the whole context and the whole block
        return self.model.blocks(self.model.embed(tokens), torch.arange(m, m + B)[None], past, mask)[0]

    def _catch_up(self) -> None:
        """Write the keys/values of context rows that arrived since the last proposal."""
        start, m = self.caches[0].length, len(self.fed)
        if start == m:
            return
        ctx = torch.cat(self.pending, dim=0)[None]  # (1, m - start, H)
        self.pending = []
        assert ctx.shape[1] == m - start, "hidden rows and committed tokens out of step"
        positions = torch.arange(start, m)[None]
        for layer, cache in zip(self.model.layers, self.caches):
            k, v = self.model.context_kv(layer, ctx, positions)
            cache.k[:, start:m] = k[0]
            cache.v[:, start:m] = v[0]
            cache.length = m

    def _draft(self, rows: torch.Tensor, anchor: int) -> Draft:
        """Tokens from block rows (n, H), left to right: the Markov bias and the confidence stop read the
        previous token (the anchor first). Sampled drafts carry the rows they were drawn from."""
        model = self.model
        logits = model.logits(rows)[:, : self.target_vocab]  # (n, V)
        markov = getattr(model, "markov_head", None)
        tokens, probs, prev, state = [], [], anchor, None
        last_id = model.cfg.vocab_size - 1
        for i in range(rows.shape[0]):
            prev_t = torch.tensor([min(prev, last_id)])  # a padding id past the drafter's rows: its last row
            if self.p_min > 0 and float(torch.sigmoid(model.confidence(rows[i : i + 1], prev_t))[0]) < self.p_min:
                break
            row = logits[i]
            if markov is not None:
                bias, state = markov.step(prev_t, rows[i : i + 1], state)
                k = min(row.shape[0], bias.shape[1])  # vocabularies may differ by padding rows
                row = torch.cat([row[:k] + bias[0, :k], row[k:]])
            if self.sampling.greedy:
                token = int(row.argmax())
            else:
                p = process_logits(row, self.sampling)
                token = sample_token(p, self.generator)
                probs.append(p)
            tokens.append(token)
            prev = token
        return Draft.chain(tokens, torch.stack(probs) if probs else None)


# -- files -------------------------------------------------------------------------------------
def read_config(path) -> BlockConfig:
    """The BlockConfig of a drafter folder (config.json only)."""
    from specdec.model.errors import ModelFileError
    from specdec.model.files import read_json_object

    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise DFlashError(f"{path}: not a DFlash/DSpark drafter folder (no config.json)")
    try:
        raw = read_json_object(cfg_file)
    except ModelFileError as exc:
        raise DFlashError(str(exc)) from None
    return BlockConfig.from_json(raw, f"drafter {path}")


def load_block_drafter(path, target: TargetParts, target_config, target_name: str = "the target",
                       max_positions: int = 4096) -> BlockDraftModel:
    """A BlockDraftModel from a folder (config.json + *.safetensors), checked against the target."""
    from safetensors import safe_open

    from specdec.model.errors import ModelFileError
    from specdec.model.files import safetensors_header

    path = Path(path)
    cfg = read_config(path)
    problem = fit_problem(cfg, target_config, target_name, f"drafter {path}", target.embed.shape[0])
    if problem:
        raise DFlashError(problem)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DFlashError(f"{path}: no .safetensors weights (pickled .bin files are never loaded; convert them)")
    model = BlockDraftModel(cfg, target, max_positions)
    own = {k: v for k, v in model.state_dict().items()}
    state = {}
    for f in files:
        try:
            header = safetensors_header(f)
        except ModelFileError as exc:
            raise DFlashError(str(exc)) from None
        for name, (_, shape) in header.items():
            key = name.removeprefix("model.")
            if key in _SKIPPED:
                if abs(shape[0] - target_config.vocab_size) > MAX_VOCAB_PADDING:
                    raise DFlashError(f"drafter {path}: {key} has {shape[0]} rows; {target_name} has a vocabulary of "
                                      f"{target_config.vocab_size}: it belongs to another model")
            elif key in own and tuple(own[key].shape) != shape:
                raise DFlashError(f"drafter {path}: tensor {name} has shape {shape}, expected "
                                  f"{tuple(own[key].shape)} from its config.json")
        try:
            with safe_open(str(f), framework="pt") as fh:
                state.update({name.removeprefix("model."): fh.get_tensor(name).float() for name in header
                              if name.removeprefix("model.") not in _SKIPPED})
        except Exception as exc:  # safetensors' own error type: data cut short after a whole header
            raise DFlashError(f"{f}: not a readable safetensors file ({exc})") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DFlashError(f"drafter {path}: missing tensors {sorted(missing)}, unexpected {sorted(unexpected)}")
    return model.eval()


def save_block_drafter(model: BlockDraftModel, folder, target_info: dict | None = None,
                       dtype: torch.dtype = torch.bfloat16, embed_tokens: torch.Tensor | None = None,
                       lm_head: torch.Tensor | None = None) -> Path:
    """Write config.json + model.safetensors in the model's published layout.

    embed_tokens / lm_head: (V, H) target weights that a DSpark folder carries (DeepSpec's loader expects
    them); DFlash folders never do."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    if model.cfg.layout == "dspark":
        for key, t in (("embed_tokens.weight", embed_tokens), ("lm_head.weight", lm_head)):
            if t is not None:
                tensors[key] = t.detach().to("cpu", dtype).contiguous()
    with replaced(folder / "model.safetensors") as tmp:  # a run killed here keeps the previous drafter whole
        save_file(tensors, str(tmp))
    raw = model.cfg.to_json()
    if target_info:
        raw["specdec"] = {"kind": model.cfg.layout, "target": target_info}
    write_text(folder / "config.json", json.dumps(raw, indent=2) + "\n")
    return folder


def make_block_drafter(target, path=None, kind: str = "draft-dflash", p_min: float = 0.0,
                       max_len: int = 4096) -> BlockDrafter:
    """The drafter `kind` (draft-dflash / draft-dspark) for a loaded target Model, from the folder `path`
    (-md / --model-draft) or one shipped for this target."""
    short = kind.removeprefix("draft-")
    if path is None:
        from specdec.drafters.mtp import shipped_head

        path = shipped_head(short, target)
        if path is None:
            what = "DFlash" if short == "dflash" else "DSpark"
            raise DFlashError(f"--spec-type {kind} needs a {what} drafter folder trained for {target.info.name}: "
                              "pass it with -md/--model-draft")
    cfg = read_config(path)
    layout = "DFlash" if cfg.layout == "dflash" else "DSpark"
    if cfg.layout != short:  # it ran as the other kind, its stats filed under the name asked for
        raise DFlashError(f"{path} is a {layout} drafter: run it with --spec-type draft-{cfg.layout} (or give -md "
                          "alone)")
    model = load_block_drafter(path, TargetParts.of(target), target.config, f"the target {target.info.name}",
                               max_len + cfg.block_size + 1)
    return BlockDrafter(model, kind, target.config.vocab_size, p_min, max_len, f"{layout} drafter {path}")


__all__ = ["BlockConfig", "BlockDraftModel", "BlockDrafter", "ConfidenceHead", "DFlashError", "MarkovHead",
           "default_target_layers",
           "TargetParts", "fit_problem", "load_block_drafter", "make_block_drafter", "read_config",
           "save_block_drafter"]
