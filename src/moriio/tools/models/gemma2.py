"""A tiny Gemma-2 (``Gemma2ForCausalLM``): sliding-window and full layers, logit softcaps.

The output projection is tied to the embedding (no ``lm_head`` weight) and the embedding is
scaled by sqrt(hidden_size): with random weights and norms of scale 1 the model only repeats
the last prompt token. Gemma's RMSNorm scales by ``1 + weight``; weights of 3 (scale 4) let
attention and the MLP outweigh the token's own embedding, so outputs depend on the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from moriio.tools.models.shapes import Shapes, attention, mlp


@dataclass(frozen=True, slots=True)
class TinyGemma2:
    """Shape of the model: 256-dimensional heads (a CPU attention size), GQA 2:1, even layers
    slide over ``sliding_window`` tokens, odd layers see the whole context."""

    vocab_size: int = 1000
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 256
    sliding_window: int = 64
    max_position_embeddings: int = 1024
    seed: int = 0
    std: float = 0.1
    norm_weight: float = 3.0

    @property
    def dirname(self) -> str:
        s = self
        return (
            f"tiny-gemma2-v{s.vocab_size}-h{s.hidden_size}-i{s.intermediate_size}"
            f"-l{s.num_hidden_layers}-a{s.num_attention_heads}-kv{s.num_key_value_heads}"
            f"-d{s.head_dim}-w{s.sliding_window}-n{s.norm_weight:g}-s{s.seed}"
        )

    def config(self) -> dict[str, object]:
        layer_types = [
            "sliding_attention" if i % 2 == 0 else "full_attention"
            for i in range(self.num_hidden_layers)
        ]
        return {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "head_dim": self.head_dim,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "layer_types": layer_types,
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "query_pre_attn_scalar": self.head_dim,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "sliding_window": self.sliding_window,
            "tie_word_embeddings": True,
            "dtype": "float32",
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }

    def tensor_shapes(self) -> Shapes:
        h = self.hidden_size
        shapes: Shapes = [("model.embed_tokens.weight", (self.vocab_size, h))]
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        for layer in range(self.num_hidden_layers):
            p = f"model.layers.{layer}"
            shapes += [(f"{p}.input_layernorm.weight", (h,))]
            shapes += attention(p, h, heads, kv_heads, self.head_dim)
            shapes += [
                (f"{p}.post_attention_layernorm.weight", (h,)),
                (f"{p}.pre_feedforward_layernorm.weight", (h,)),
            ]
            shapes += mlp(p, h, self.intermediate_size)
            shapes += [(f"{p}.post_feedforward_layernorm.weight", (h,))]
        shapes += [("model.norm.weight", (h,))]
        return shapes
