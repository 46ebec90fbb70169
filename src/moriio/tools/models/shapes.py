"""Weight-name tables shared by the tiny models: Hugging Face names, (out, in) shapes."""

from __future__ import annotations

Shapes = list[tuple[str, tuple[int, ...]]]


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
