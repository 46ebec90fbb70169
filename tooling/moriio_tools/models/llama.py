"""The tools' default model: a tiny Llama (``LlamaForCausalLM``) with seeded random weights."""

from __future__ import annotations

from dataclasses import dataclass

from moriio_tools.models.configs import decoder_config, model_dirname
from moriio_tools.models.shapes import Shapes, attention, decoder


@dataclass(frozen=True, slots=True)
class TinyLlama:
    """Shape of the default model (head_dim = hidden_size / num_attention_heads = 64)."""

    vocab_size: int = 1000
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    seed: int = 0
    std: float = 0.1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def norm_weight(self) -> float:
        """Every RMSNorm weight (Llama scales by the weight: 1 leaves the input as is)."""
        return 1.0

    @property
    def dirname(self) -> str:
        """A directory name that changes whenever the shape or the seed does."""
        return model_dirname("llama", self, f"-kv{self.num_key_value_heads}")

    def config(self) -> dict[str, object]:
        """The Hugging Face ``config.json`` content."""
        return {
            **decoder_config(self, "LlamaForCausalLM", "llama"),
            "head_dim": self.head_dim,
            "mlp_bias": False,
            "num_key_value_heads": self.num_key_value_heads,
            "pretraining_tp": 1,
        }

    def tensor_shapes(self) -> Shapes:
        """Every weight in a fixed order (the order the generator draws them)."""
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        return decoder(
            self, lambda p: attention(p, self.hidden_size, heads, kv_heads, self.head_dim)
        )
