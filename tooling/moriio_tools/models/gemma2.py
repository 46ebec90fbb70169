"""A tiny Gemma-2 (``Gemma2ForCausalLM``): sliding-window and full layers, logit softcaps.

The output projection is tied to the embedding (no ``lm_head`` weight) and the embedding is
scaled by sqrt(hidden_size): with random weights and norms of scale 1 the model only repeats
the last prompt token. Gemma's RMSNorm scales by ``1 + weight``; weights of 3 (scale 4) let
attention and the MLP outweigh the token's own embedding, so outputs depend on the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from moriio_tools.models.configs import decoder_config, model_dirname
from moriio_tools.models.shapes import Shapes, attention, decoder, mlp


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
        sizes = f"-kv{s.num_key_value_heads}-d{s.head_dim}-w{s.sliding_window}-n{s.norm_weight:g}"
        return model_dirname("gemma2", self, sizes)

    def config(self) -> dict[str, object]:
        layer_types = [
            "sliding_attention" if i % 2 == 0 else "full_attention"
            for i in range(self.num_hidden_layers)
        ]
        return {
            **decoder_config(self, "Gemma2ForCausalLM", "gemma2"),
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "pad_token_id": 0,
            "head_dim": self.head_dim,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "layer_types": layer_types,
            "num_key_value_heads": self.num_key_value_heads,
            "query_pre_attn_scalar": self.head_dim,
            "sliding_window": self.sliding_window,
            "tie_word_embeddings": True,
        }

    def tensor_shapes(self) -> Shapes:
        return decoder(self, self._attention, self._feed_forward, tied=True)

    def _attention(self, prefix: str) -> Shapes:
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        return attention(prefix, self.hidden_size, heads, kv_heads, self.head_dim)

    def _feed_forward(self, prefix: str) -> Shapes:
        """The MLP between its own pre- and post-norms."""
        h = self.hidden_size
        return [
            (f"{prefix}.pre_feedforward_layernorm.weight", (h,)),
            *mlp(prefix, h, self.intermediate_size),
            (f"{prefix}.post_feedforward_layernorm.weight", (h,)),
        ]
