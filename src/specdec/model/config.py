"""Model configuration: one dataclass for the whole Llama family.

Per-family differences (Qwen2's q/k/v biases, Qwen3's q/k norms, tied embeddings)
are fields here, not forks of the model code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")

# Families people run that specdec cannot run yet, by config.json model_type and GGUF architecture:
# one sentence saying why, for the error and for `specdec inspect`.
_MOE = "a mixture-of-experts model"
UNSUPPORTED_FAMILIES = {
    "deepseek_v3": f"DeepSeek-V3 is {_MOE} with multi-head latent attention (MLA)",
    "deepseek_v2": f"DeepSeek-V2 is {_MOE} with multi-head latent attention (MLA)",
    "deepseek2": f"DeepSeek-V2/V3 is {_MOE} with multi-head latent attention (MLA)",
    "glm4_moe": f"GLM-4.5 is {_MOE}",
    "glm4moe": f"GLM-4.5 is {_MOE}",
    "qwen3_next": f"Qwen3-Next is {_MOE} with hybrid linear attention (Gated DeltaNet layers)",
    "qwen3next": f"Qwen3-Next is {_MOE} with hybrid linear attention (Gated DeltaNet layers)",
    "qwen3_5": "Qwen3.5 mixes linear attention (Gated DeltaNet) with full attention layers",
    "qwen3_5_moe": f"Qwen3.5 MoE is {_MOE} with hybrid linear attention",
    "qwen2_moe": f"Qwen2-MoE is {_MOE}", "qwen2moe": f"Qwen2-MoE is {_MOE}",
    "qwen3_moe": f"Qwen3-MoE is {_MOE}", "qwen3moe": f"Qwen3-MoE is {_MOE}",
    "mixtral": f"Mixtral is {_MOE}",
    "gemma3": "Gemma 3 (sliding-window layers, GeGLU, four norms per block) is not implemented yet",
    "gemma3_text": "Gemma 3 (sliding-window layers, GeGLU, four norms per block) is not implemented yet",
}


def unsupported_reason(name: str, runs: str) -> str:
    """The sentence for a model_type / GGUF architecture specdec cannot run; `runs` lists what it runs."""
    why = UNSUPPORTED_FAMILIES.get(name)
    if why is None:
        return f"{name!r} is not supported (specdec runs {runs})"
    return f"{why}: specdec cannot run it yet (it runs dense {runs} models)"


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
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(
                f"unsupported architecture {self.arch!r}; specdec runs {', '.join(SUPPORTED_ARCHS)}"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise ValueError(f"{len(self.rope_freq_factors)} RoPE frequency factors for head_dim {self.head_dim}; "
                             f"expected {self.head_dim // 2}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        return 2 * self.num_layers * self.kv_size * bytes_per_value


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

