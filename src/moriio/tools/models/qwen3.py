"""A tiny Qwen3 (``Qwen3ForCausalLM``): GQA with per-head RMSNorm on queries and keys."""

from __future__ import annotations

from dataclasses import dataclass

from moriio.tools.models.shapes import Shapes, attention, mlp


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
        s = self
        return (
            f"tiny-qwen3-v{s.vocab_size}-h{s.hidden_size}-i{s.intermediate_size}"
            f"-l{s.num_hidden_layers}-a{s.num_attention_heads}-kv{s.num_key_value_heads}"
            f"-d{s.head_dim}-s{s.seed}"
        )

    def config(self) -> dict[str, object]:
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
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
            "max_window_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "sliding_window": None,
            "use_sliding_window": False,
            "tie_word_embeddings": False,
            "dtype": "float32",
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }

    def tensor_shapes(self) -> Shapes:
        h, d = self.hidden_size, self.head_dim
        shapes: Shapes = [("model.embed_tokens.weight", (self.vocab_size, h))]
        for layer in range(self.num_hidden_layers):
            p = f"model.layers.{layer}"
            shapes += [(f"{p}.input_layernorm.weight", (h,))]
            shapes += attention(p, h, self.num_attention_heads, self.num_key_value_heads, d)
            shapes += [
                (f"{p}.self_attn.q_norm.weight", (d,)),
                (f"{p}.self_attn.k_norm.weight", (d,)),
                (f"{p}.post_attention_layernorm.weight", (h,)),
            ]
            shapes += mlp(p, h, self.intermediate_size)
        shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab_size, h))]
        return shapes
