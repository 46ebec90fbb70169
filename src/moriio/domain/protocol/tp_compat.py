"""What two peers of different TP sizes may differ in, and whether their shards line up.

A rank's page holds its shard of the KV heads (and of a recurrent state): its head slots,
cell bytes, page bytes and state shapes scale with the TP size, so the fingerprint fields
saying so (:data:`TP_SCALED_LAYER_FIELDS`, the shapes and page of a state group) may differ
between peers of different TP sizes. Whether the shards line up is checked layer by layer
on the regions a peer sends (:mod:`moriio.domain.protocol.tp_layers`).
"""

from __future__ import annotations

from collections.abc import Sequence

TP_SCALED_LAYER_FIELDS = ("heads", "content_bytes", "page_bytes")
STATE_MARK = ":state="


def tp_pair_problem(ours: int, theirs: int) -> str | None:
    """Why two TP sizes cannot pair (None: one is a multiple of the other)."""
    larger, smaller = max(ours, theirs), min(ours, theirs)
    if larger % smaller:
        return f"TP sizes {ours} and {theirs} must be a multiple of each other"
    return None


def tp_invariant_group(group: str) -> str:
    """A group's description without what scales with the TP size (a state's per-rank shapes
    and page: ``Spec:n:state=shapes/dtypes/kind/page`` keeps ``dtypes/kind``)."""
    head, mark, state = group.partition(STATE_MARK)
    if not mark:
        return group
    parts = state.split("/")
    return head + mark + "/".join(parts[1:-1]) if len(parts) >= 3 else group


def same_groups_across_tp(ours: Sequence[str], theirs: Sequence[str]) -> bool:
    """Whether two peers' groups agree in everything a TP size does not scale."""
    return len(ours) == len(theirs) and all(
        tp_invariant_group(a) == tp_invariant_group(b) for a, b in zip(ours, theirs, strict=True)
    )
