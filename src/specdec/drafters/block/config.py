"""A block drafter's settings (BlockConfig), read from and written to its config.json.

Two published layouts share one backbone (model.py) (`BlockConfig.layout`):

  dflash  z-lab/dflash, architectures ["DFlashDraftModel"]: row i >= 1 (a MASK at position m+i) predicts
          the token at m+i itself; the anchor row's output is dropped: B - 1 drafts, each sampled from its
          own row (rows are independent given the context).
  dspark  deepseek-ai/DeepSpec, ["Qwen3DSparkModel"]: "anchor-first", row i predicts the token AFTER it
          (position m+i+1), so the anchor row drafts too: B drafts. Tokens are drawn left to right with a
          low-rank Markov bias indexed by the previous token (vanilla: markov_w2(markov_w1[prev]); gated
          and rnn variants as published), and a confidence head sigmoid(proj([h_i; markov_w1[prev]]))
          ends the block at the first position below --spec-draft-p-min. DeepSpec's own "DFlash"
          checkpoints are this layout with markov_rank 0 and no confidence head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec.model.config import llama3_rope_factors, rope_scaling_of, rope_theta_of, size_problem
from specdec.model.errors import SpecdecError
from specdec.sampling import is_whole

MAX_VOCAB_PADDING = 128  # as draft_model.MAX_VOCAB_PADDING: embedding rows padded past the tokenizer
MARKOV_KINDS = ("vanilla", "gated", "rnn")


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
        if not isinstance(ids, (list, tuple)) or not all(is_whole(i) for i in ids):  # a list: not "13" (layers 1 and 3)
            raise DFlashError(f"{where}: target_layer_ids must be a list of layer numbers, got {ids!r}")
        mask = extra.get("mask_token_id")
        if mask is not None and (not is_whole(mask) or mask < 0):
            raise DFlashError(f"{where}: mask_token_id must be a token id, got {mask!r}")
        block = extra.get("block_size")
        if not is_whole(block) or block < 2:  # a whole number: 3.7 is not 3
            raise DFlashError(f"{where}: block_size must be at least 2, got {block!r}")
        scaling = rope_scaling_of(raw)
        rope_type = scaling and (scaling.get("rope_type") or scaling.get("type"))
        if scaling is not None and rope_type != "llama3":
            raise DFlashError(f"{where} uses {rope_type!r} RoPE scaling; specdec runs plain and llama3 RoPE only")
        rank = extra.get("markov_rank") or 0
        if not is_whole(rank) or rank < 0:  # a whole number >= 0: 8.7 is not 8
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
