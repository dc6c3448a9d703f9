"""A mixture-of-experts MLP's settings (ModelConfig.moe), read from config.json or GGUF metadata.

    scores  = softmax(router(h)) or sigmoid(router(h))                 (E,) per row
    choice  = scores + bias, limited to the best `groups_used` of `groups` groups (a group's score: the
              sum of its two best), then its top k experts                         (DeepSeek-V3, GLM-4.5)
    weights = scores[choice], / their sum (norm_topk), * routed_scale
    out     = sum_j weights[j] * expert_{choice[j]}(h)  + shared(h)  (Qwen3.5-MoE: * sigmoid(shared_gate(h)))

Each expert is a SwiGLU MLP of `expert_intermediate`. `layers` lists the decoder layers whose MLP is this
mixture; the others keep the dense MLP of ModelConfig.intermediate_size (GLM's first_k_dense_replace,
Qwen's mlp_only_layers / decoder_sparse_step). Read the same way transformers 5.24's qwen3_moe, qwen3_5_moe
and glm4_moe modeling files and llama.cpp's converter (convert_hf_to_gguf.py, its expert_* keys) do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCORINGS = ("softmax", "sigmoid")
_GGUF_GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE values


@dataclass(frozen=True)
class MoEConfig:
    experts: int  # routed experts of a mixture layer (E)
    experts_per_token: int  # k, chosen per row
    expert_intermediate: int  # each routed expert's MLP width
    layers: tuple[int, ...]  # the decoder layers that are mixtures
    scoring: str = "softmax"  # SCORINGS
    norm_topk: bool = True  # the k weights divided by their sum
    norm_floor: float = 0.0  # added to that sum (transformers' glm4_moe: 1e-20; qwen3_moe: none)
    routed_scale: float = 1.0  # the k weights times this (GLM's routed_scaling_factor)
    groups: int = 1  # expert groups; the choice is limited to the best groups_used of them
    groups_used: int = 1
    score_bias: bool = False  # a per-expert bias added to the scores for the choice only (e_score_correction_bias)
    shared_intermediate: int = 0  # width of the shared expert, run on every row (0: none)
    shared_gate: bool = False  # the shared expert's output times sigmoid(shared_expert_gate(h)) (Qwen3.5-MoE)

    def __post_init__(self) -> None:
        for name in ("experts", "experts_per_token", "expert_intermediate", "groups", "groups_used"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} is {value!r}; a whole number of at least 1 is expected")
        if self.experts_per_token > self.experts:
            raise ValueError(f"{self.experts_per_token} experts per token, but only {self.experts} experts")
        if self.scoring not in SCORINGS:
            raise ValueError(f"expert scoring {self.scoring!r} is not computed; specdec computes {', '.join(SCORINGS)}")
        if self.experts % self.groups or self.groups_used > self.groups:
            raise ValueError(f"{self.experts} experts in {self.groups} groups, {self.groups_used} of them used: the "
                             "groups must divide the experts and be at least as many as those used")
        if self.groups > 1 and self.experts // self.groups < 2:
            raise ValueError("a group of experts is scored by its two best; each group needs at least 2 experts")
        if self.groups > 1 and self.experts_per_token > self.groups_used * (self.experts // self.groups):
            raise ValueError(f"{self.experts_per_token} experts per token cannot come from {self.groups_used} "
                             f"groups of {self.experts // self.groups}")
        if not (math.isfinite(self.routed_scale) and math.isfinite(self.norm_floor) and self.norm_floor >= 0):
            raise ValueError(f"routed scale {self.routed_scale} / norm floor {self.norm_floor} must be finite "
                             "(the floor at least 0)")
        if self.shared_intermediate < 0 or self.shared_gate and not self.shared_intermediate:
            raise ValueError("a shared expert gate needs a shared expert of width at least 1")

    def is_moe(self, layer: int) -> bool:
        return layer in self.layers


def moe_from_hf(raw: dict, model_type: str, num_layers: int) -> MoEConfig:
    """MoEConfig of a config.json (qwen3_moe, qwen3_5_moe's text part, qwen3_next, glm4_moe) as transformers reads it.
    KeyError for a size it lacks, ValueError for values that do not fit (both named by the caller)."""
    def first(*keys):  # transformers 5 writes num_local_experts where the published files say num_experts
        return raw[next((k for k in keys if raw.get(k) is not None), keys[0])]

    if model_type == "glm4_moe":
        first_dense = int(raw.get("first_k_dense_replace", 1))
        return MoEConfig(
            experts=int(first("n_routed_experts", "num_local_experts")), experts_per_token=int(raw["num_experts_per_tok"]),
            expert_intermediate=int(raw["moe_intermediate_size"]),
            layers=tuple(range(first_dense, num_layers)), scoring="sigmoid",
            norm_topk=bool(raw.get("norm_topk_prob", True)), norm_floor=1e-20,
            routed_scale=float(raw.get("routed_scaling_factor", 1.0)),
            groups=int(raw.get("n_group", 1)), groups_used=int(raw.get("topk_group", 1)), score_bias=True,
            shared_intermediate=int(raw["moe_intermediate_size"]) * int(raw.get("n_shared_experts", 1)))
    # qwen3_moe: mixtures where (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers
    step = int(raw.get("decoder_sparse_step", 1))
    dense = set(raw.get("mlp_only_layers") or [])
    layers = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
    shared = int(raw.get("shared_expert_intermediate_size") or 0) if model_type in ("qwen3_5_moe", "qwen3_next") else 0
    return MoEConfig(
        experts=int(first("num_experts", "num_local_experts")), experts_per_token=int(raw["num_experts_per_tok"]),
        expert_intermediate=int(raw["moe_intermediate_size"]), layers=layers, scoring="softmax",
        # transformers' qwen3_5_moe router always normalizes; qwen3_moe's and qwen3_next's as norm_topk_prob says
        norm_topk=True if model_type == "qwen3_5_moe" else bool(raw.get("norm_topk_prob", model_type == "qwen3_next")),
        shared_intermediate=shared, shared_gate=bool(shared))


def moe_from_gguf(meta: dict, arch: str, num_layers: int, score_bias: bool) -> MoEConfig:
    """MoEConfig of a GGUF file's <arch>.expert_* metadata, as llama.cpp reads it (qwen3moe normalizes the k
    weights and scores by softmax whatever the file says; glm4moe by sigmoid unless expert_gating_func says).
    score_bias: whether the file holds the selection bias (exp_probs_b). KeyError for a key it lacks,
    ValueError for values that do not fit."""
    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise KeyError(f"{arch}.{name}")
        return value

    first_dense = int(key("leading_dense_block_count", 0))
    gating = _GGUF_GATING.get(int(key("expert_gating_func", 2 if arch == "glm4moe" else 1)))
    if gating is None:
        raise ValueError(f"{arch}.expert_gating_func is {meta.get(f'{arch}.expert_gating_func')}; specdec computes "
                         "softmax (1) and sigmoid (2) expert scores")
    shared = int(key("expert_shared_feed_forward_length", 0))
    if not shared and int(key("expert_shared_count", 0)):
        shared = int(key("expert_shared_count")) * int(key("expert_feed_forward_length"))
    glm = arch == "glm4moe"
    return MoEConfig(
        experts=int(key("expert_count")), experts_per_token=int(key("expert_used_count")),
        expert_intermediate=int(key("expert_feed_forward_length")),
        layers=tuple(range(first_dense, num_layers)), scoring=gating,
        norm_topk=bool(key("expert_weights_norm", True)) if glm else True, norm_floor=1e-20 if glm else 0.0,
        routed_scale=float(key("expert_weights_scale", 1.0) or 1.0),
        groups=int(key("expert_group_count", 1) or 1), groups_used=int(key("expert_group_used_count", 1) or 1),
        score_bias=score_bias, shared_intermediate=shared, shared_gate=arch in ("qwen35moe", "qwen3next"))


def moe_shapes(moe: MoEConfig, hidden: int, prefix: str) -> dict[str, tuple[int, ...]]:
    """name -> shape (transformers' order) of one mixture layer's tensors, the routed experts stacked as llama.cpp
    stores them (mlp.experts.gate_proj.weight (E, I, H), ...; a folder's per-expert tensors are stacked so).
    prefix: the layer's, "model.layers.3." (the shared expert's gate, (1, H) in a folder, is (H,) in a GGUF file:
    not listed)."""
    E, I, H, S = moe.experts, moe.expert_intermediate, hidden, moe.shared_intermediate
    out = {prefix + "mlp.gate.weight": (E, H), prefix + "mlp.experts.gate_proj.weight": (E, I, H),
           prefix + "mlp.experts.up_proj.weight": (E, I, H), prefix + "mlp.experts.down_proj.weight": (E, H, I)}
    if moe.score_bias:
        out[prefix + "mlp.gate.e_score_correction_bias"] = (E,)
    if S:
        out.update({prefix + "mlp.shared_experts.gate_proj.weight": (S, H),
                    prefix + "mlp.shared_experts.up_proj.weight": (S, H),
                    prefix + "mlp.shared_experts.down_proj.weight": (H, S)})
    return out
