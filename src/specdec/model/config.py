"""Model configuration: one dataclass for every family specdec runs (Llama, Qwen2, Qwen3, Gemma 3, the
mixture-of-experts Qwen3-MoE and GLM-4.5, whose MLP settings are a MoEConfig, model/moe_config.py, and the
Qwen3.5 hybrids, dense (qwen35) or with that MoE MLP (qwen35moe), whose linear layers are a LinearAttention).

Per-family differences (Qwen2's q/k/v biases, Qwen3's q/k norms, tied embeddings; Gemma 3's
GeGLU, four norms per block, scaled embeddings, sliding-window layers with their own RoPE base,
attention scale) are fields here, read by the one decoder layer (model/layers.py) and the
runtime (model/transformer.py), not forks of the model code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdec.model.gemma4_layout import Gemma4Layout
from specdec.model.hybrid_config import LinearAttention
from specdec.model.moe_config import MoEConfig

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "glm4moe", "qwen35", "qwen35moe", "qwen3next", "gemma4")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")  # SwiGLU; GeGLU with the tanh approximation of gelu

# Families people run that specdec cannot run yet, by config.json model_type and GGUF architecture:
# one sentence saying why, for the error and for `specdec inspect`.
_MOE = "a mixture-of-experts model"
UNSUPPORTED_FAMILIES = {
    "deepseek_v3": "DeepSeek-V3 attends with multi-head latent attention (MLA)",
    "deepseek_v2": "DeepSeek-V2 attends with multi-head latent attention (MLA)",
    "deepseek2": "DeepSeek-V2/V3 attend with multi-head latent attention (MLA)",
    # Gemma 4 runs from a folder (model_type gemma4: its text model) and a gemma4 GGUF file; not its assistant's GGUF
    "gemma4-assistant": "a Gemma 4 assistant GGUF file is not read; give the assistant's Hugging Face folder with -md",
    "gemma4_assistant": "'gemma4_assistant' is Gemma 4's drafter, not a model to generate with: give it with -md "
                        "beside its Gemma 4 target",
    "qwen2_moe": f"Qwen2-MoE is {_MOE}", "qwen2moe": f"Qwen2-MoE is {_MOE}",
    "mixtral": f"Mixtral is {_MOE}",
    # config.json model_type gemma3 is the multimodal checkpoint (the GGUF architecture gemma3 is text-only)
    "gemma3": "'gemma3' is multimodal Gemma 3 (a vision tower beside the language model; the text-only "
              "model is model_type gemma3_text, or a gemma3 GGUF file)",
}


def unsupported_reason(name: str, runs: str) -> str:
    """The sentence for a model_type / GGUF architecture specdec cannot run; `runs` lists what it runs."""
    why = UNSUPPORTED_FAMILIES.get(name)
    if name == "gemma4_assistant":  # a drafter, which specdec runs as one
        return why
    if why is None:
        return f"{name!r} is not supported (specdec runs {runs})"
    return f"{why}: specdec cannot run it yet (it runs {runs} models)"


def size_problem(sizes: dict[str, int], heads: str, kv_heads: str) -> str | None:
    """What is wrong with a decoder's sizes (name -> value), or None: a size under 1, or query heads (sizes[heads])
    that are no multiple of the key/value heads (sizes[kv_heads]). ModelConfig and the draft heads' configs
    (EAGLE-3, DFlash) check theirs with it."""
    bad = next((name for name, value in sizes.items() if not value >= 1), None)
    if bad is not None:
        return f"{bad} must be at least 1, got {sizes[bad]}"
    if sizes[heads] % sizes[kv_heads]:
        return f"{heads} {sizes[heads]} is not a multiple of {kv_heads} {sizes[kv_heads]}"
    return None


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    context_length: int = 4096
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    # RoPE frequency divisors, one per rotated pair (head_dim / 2): Llama 3.x "llama3" scaling, from
    # config.json rope_scaling or GGUF rope_freqs.weight. None = plain RoPE.
    rope_freq_factors: tuple[float, ...] | None = None
    # MTP layers the config declares (num_nextn_predict_layers / mtp_num_hidden_layers);
    # whether the weights are present is a property of the loaded checkpoint.
    mtp_layers_declared: int = 0
    # Gemma 3 (the defaults are Llama's):
    mlp_act: str = "silu"  # MLP_ACTIVATIONS: act(gate) * up
    sandwich_norms: bool = False  # also a norm on the attention output and on the MLP output (four per block)
    embed_scale: float = 1.0  # embedding rows times this, in float32 (Gemma: hidden_size ** 0.5)
    attn_scale: float | None = None  # scale of q.k; None = 1 / sqrt(head_dim) (Gemma: query_pre_attn_scalar ** -0.5)
    sliding_window: int = 0  # a local layer's query sees keys at positions p - window + 1 .. p (itself included)
    sliding_layers: tuple[int, ...] = ()  # indices of the local (sliding-window) layers; the others are global
    rope_local_theta: float | None = None  # RoPE base of the local layers, plain RoPE (Gemma: rope_local_base_freq);
    #                                        None = the global layers' (rope_theta with rope_freq_factors)
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap); None = none
    rope_dims: int = 0  # dimensions of each head RoPE rotates, the first ones (GLM-4.5: half); 0 = all of them
    moe: MoEConfig | None = None  # the mixture-of-experts MLP of the layers it lists (None: every MLP dense)
    # Qwen3.5 / 3.6 (hybrid): Gated DeltaNet layers (model/hybrid_config.py), the others full attention whose
    # q_proj also gives a per-head output gate: attention * sigmoid(gate) before o_proj
    linear_attention: LinearAttention | None = None
    attn_output_gate: bool = False
    gemma4: Gemma4Layout | None = None  # Gemma 4: its per-kind head geometry, KV sharing, per-layer inputs
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(
                f"unsupported architecture {self.arch!r}; specdec runs {', '.join(SUPPORTED_ARCHS)}"
            )
        problem = size_problem({name: getattr(self, name) for name in (
            "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
            "context_length")}, "num_heads", "num_kv_heads")
        if problem is not None:
            raise ValueError(problem)
        if self.head_dim % 2:  # RoPE rotates pairs of dimensions
            raise ValueError(f"head_dim is {self.head_dim}; RoPE needs an even head dimension")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"rope_theta is {self.rope_theta}; it must be a positive number")
        if not (self.rms_norm_eps >= 0 and math.isfinite(self.rms_norm_eps)):
            raise ValueError(f"rms_norm_eps is {self.rms_norm_eps}; it must be a finite number of at least 0")
        if self.mlp_act not in MLP_ACTIVATIONS:
            raise ValueError(f"unknown MLP activation {self.mlp_act!r}; specdec computes {', '.join(MLP_ACTIVATIONS)}")
        if any(not 0 <= i < self.num_layers for i in self.sliding_layers):
            raise ValueError(f"sliding layers {self.sliding_layers} are not all among the {self.num_layers} layers")
        if self.sliding_layers and self.sliding_window < 1:
            raise ValueError(f"sliding layers {self.sliding_layers} need a sliding window of at least 1 token")
        if self.rope_dims % 2 or not 0 <= self.rope_dims <= self.head_dim:
            raise ValueError(f"RoPE rotates {self.rope_dims} of {self.head_dim} head dimensions; an even number up to "
                             "the head dimension is expected")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.rotary_dims // 2:
            raise ValueError(f"{len(self.rope_freq_factors)} RoPE frequency factors for {self.rotary_dims} rotated "
                             f"dimensions; expected {self.rotary_dims // 2}")
        if self.linear_attention is not None and any(not 0 <= i < self.num_layers
                                                     for i in self.linear_attention.layers):
            raise ValueError(f"linear attention layers {self.linear_attention.layers} are not all among the "
                             f"{self.num_layers} layers")
        if self.moe is not None and any(not 0 <= i < self.num_layers for i in self.moe.layers):
            raise ValueError(f"mixture-of-experts layers {self.moe.layers} are not all among the {self.num_layers} "
                             "layers")

    @property
    def rotary_dims(self) -> int:
        """The dimensions of each head RoPE rotates (the first ones): rope_dims, or the whole head."""
        return self.rope_dims or self.head_dim

    @property
    def attention_scale(self) -> float:
        """The scale of q.k: attn_scale, or 1 / sqrt(head_dim) (a python float, as transformers computes it)."""
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def window(self, layer: int) -> int:
        """Keys layer `layer`'s queries see, counted back from the query's position (0 = all)."""
        return self.sliding_window if layer in self.sliding_layers else 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """Keys and values of one position, in the full-attention layers (a hybrid's linear layers keep none)."""
        if self.gemma4 is not None:  # Gemma 4: the layers that own keys, each kind at its own width
            g = self.gemma4
            return 2 * bytes_per_value * sum(
                g.global_kv_heads * g.global_head_dim if i not in self.sliding_layers else self.kv_size
                for i in range(self.num_layers) if g.owns_kv(i))
        full = self.num_layers - (len(self.linear_attention.layers) if self.linear_attention is not None else 0)
        return 2 * full * self.kv_size * bytes_per_value

    def recurrent_state_bytes(self) -> int:
        """One float32 state of every linear-attention layer (convolution window and delta-rule state); 0 if none."""
        la = self.linear_attention
        return 0 if la is None else 4 * len(la.layers) * ((la.conv_kernel - 1) * la.conv_dim + la.state_numel)


def linear_rope_factors(head_dim: int, factor: float) -> tuple[float, ...]:
    """"linear" RoPE scaling (position interpolation) as frequency divisors: every frequency divided by factor."""
    if not isinstance(factor, (int, float)) or not factor > 0:
        raise ValueError(f"linear rope scaling needs a positive factor, got {factor!r}")
    return (float(factor),) * (head_dim // 2)


def rope_theta_of(raw: dict, default: float) -> float:
    """A config.json's RoPE base: rope_theta, or transformers 5's rope_parameters.rope_theta; `default` when
    neither says."""
    return float(raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta") or default)


def rope_scaling_of(raw: dict) -> dict | None:
    """A drafter config.json's RoPE scaling: rope_scaling, or transformers 5's rope_parameters less its
    rope_theta; None for plain RoPE (absent, or type "default"). A ValueError where it is not an object."""
    rope = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or ({k: v for k, v in rope.items() if k != "rope_theta"} or None)
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be an object, got {scaling!r}")
    kind = scaling and (scaling.get("rope_type") or scaling.get("type"))
    return None if kind in (None, "default") else scaling


def llama3_rope_factors(head_dim: int, theta: float, scaling: dict) -> tuple[float, ...]:
    """The divisor of each RoPE frequency under Llama 3.x "llama3" scaling (what llama.cpp's
    converter writes as rope_freqs.weight): high frequencies kept, low ones divided by `factor`,
    a smooth blend between (Meta's reference, as transformers computes it).

    scaling: config.json's rope_scaling: factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings.
    """
    try:
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_context = float(scaling["original_max_position_embeddings"])
    except KeyError as exc:
        raise ValueError(f"llama3 rope_scaling lacks {exc.args[0]!r}") from None
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)

