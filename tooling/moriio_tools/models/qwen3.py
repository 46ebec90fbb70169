"""A tiny Qwen3 (``Qwen3ForCausalLM``): GQA with per-head RMSNorm on queries and keys."""

from __future__ import annotations

from dataclasses import dataclass

from moriio_tools.models.configs import decoder_config, model_dirname
from moriio_tools.models.shapes import Shapes, attention, decoder


@dataclass(frozen=True, slots=True)
class TinyQwen3:
    """Shape of the model: 4 query heads share 2 KV heads of 64 dimensions."""

    vocab_size: int = 1000
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 1024
    seed: int = 0
    std: float = 0.1

    @property
    def norm_weight(self) -> float:
        return 1.0

    @property
    def dirname(self) -> str:
        return model_dirname("qwen3", self, f"-kv{self.num_key_value_heads}-d{self.head_dim}")

    def config(self) -> dict[str, object]:
        return {
            **decoder_config(self, "Qwen3ForCausalLM", "qwen3"),
            "head_dim": self.head_dim,
            "max_window_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "sliding_window": None,
            "use_sliding_window": False,
        }

    def tensor_shapes(self) -> Shapes:
        return decoder(self, self._attention)

    def _attention(self, prefix: str) -> Shapes:
        d = self.head_dim
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        return [
            *attention(prefix, self.hidden_size, heads, kv_heads, d),
            (f"{prefix}.self_attn.q_norm.weight", (d,)),
            (f"{prefix}.self_attn.k_norm.weight", (d,)),
        ]
