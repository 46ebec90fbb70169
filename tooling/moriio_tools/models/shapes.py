"""Weight-name tables shared by the tiny models: Hugging Face names, (out, in) shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

Shapes = list[tuple[str, tuple[int, ...]]]


class DecoderShape(Protocol):
    """The sizes every tiny decoder has (a frozen dataclass's fields)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def max_position_embeddings(self) -> int: ...
    @property
    def seed(self) -> int: ...


def decoder(
    shape: DecoderShape,
    attention: Callable[[str], Shapes],
    feed_forward: Callable[[str], Shapes] | None = None,
    *,
    tied: bool = False,
) -> Shapes:
    """Every weight of a decoder, in the order the generator draws them.

    Each layer (under ``prefix``) is its input norm, ``attention(prefix)``, its
    post-attention norm and ``feed_forward(prefix)`` (by default a gated MLP); a final norm
    and, unless ``tied`` to the embedding, ``lm_head`` follow the layers.
    """
    h, v = shape.hidden_size, shape.vocab_size
    shapes: Shapes = [("model.embed_tokens.weight", (v, h))]
    for layer in range(shape.num_hidden_layers):
        p = f"model.layers.{layer}"
        shapes += [(f"{p}.input_layernorm.weight", (h,))]
        shapes += attention(p)
        shapes += [(f"{p}.post_attention_layernorm.weight", (h,))]
        shapes += feed_forward(p) if feed_forward else mlp(p, h, shape.intermediate_size)
    shapes += [("model.norm.weight", (h,))]
    if not tied:
        shapes += [("lm_head.weight", (v, h))]
    return shapes


def mlp(prefix: str, hidden: int, intermediate: int) -> Shapes:
    """A gated MLP (``gate_proj``, ``up_proj``, ``down_proj``) under ``prefix``."""
    return [
        (f"{prefix}.mlp.gate_proj.weight", (intermediate, hidden)),
        (f"{prefix}.mlp.up_proj.weight", (intermediate, hidden)),
        (f"{prefix}.mlp.down_proj.weight", (hidden, intermediate)),
    ]


def attention(prefix: str, hidden: int, heads: int, kv_heads: int, head_dim: int) -> Shapes:
    """Separate ``q/k/v/o`` projections without biases under ``prefix``."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return [
        (f"{prefix}.self_attn.q_proj.weight", (q, hidden)),
        (f"{prefix}.self_attn.k_proj.weight", (kv, hidden)),
        (f"{prefix}.self_attn.v_proj.weight", (kv, hidden)),
        (f"{prefix}.self_attn.o_proj.weight", (hidden, q)),
    ]
