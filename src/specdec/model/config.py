"""Model configuration: one dataclass for the whole Llama family.

Per-family differences (Qwen2's q/k/v biases, Qwen3's q/k norms, tied embeddings)
are fields here, not forks of the model code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")


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

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        return 2 * self.num_layers * self.kv_size * bytes_per_value
