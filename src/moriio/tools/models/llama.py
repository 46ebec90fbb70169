"""The tools' default model: a tiny Llama (``LlamaForCausalLM``) with seeded random weights."""

from __future__ import annotations

from dataclasses import dataclass

from moriio.tools.models.shapes import Shapes, attention, mlp


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
        s = self
        return (
            f"tiny-llama-v{s.vocab_size}-h{s.hidden_size}-i{s.intermediate_size}"
            f"-l{s.num_hidden_layers}-a{s.num_attention_heads}-kv{s.num_key_value_heads}"
            f"-s{s.seed}"
        )

    def config(self) -> dict[str, object]:
        """The Hugging Face ``config.json`` content."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": False,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "tie_word_embeddings": False,
            "dtype": "float32",
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }

    def tensor_shapes(self) -> Shapes:
        """Every weight in a fixed order (the order the generator draws them)."""
        h, v = self.hidden_size, self.vocab_size
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        shapes: Shapes = [("model.embed_tokens.weight", (v, h))]
        for layer in range(self.num_hidden_layers):
            p = f"model.layers.{layer}"
            shapes += [
                (f"{p}.input_layernorm.weight", (h,)),
                *attention(p, h, heads, kv_heads, self.head_dim),
                (f"{p}.post_attention_layernorm.weight", (h,)),
                *mlp(p, h, self.intermediate_size),
            ]
        shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
        return shapes
