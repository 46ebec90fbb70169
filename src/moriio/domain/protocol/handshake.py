"""What peers exchange in a handshake besides the fingerprint: each layer's registered memory
(the fingerprint and its check are in :mod:`moriio.domain.protocol.fingerprint`)."""

from __future__ import annotations

from dataclasses import dataclass

from moriio.domain.kv.head_slices import SliceLayout
from moriio.domain.protocol.fingerprint import require_positive, require_text


@dataclass(frozen=True, slots=True)
class LayerRegions:
    """One layer's registered memory as a peer needs it to address blocks.

    ``descriptors``: one transfer-engine region descriptor per registered region of the layer
    (a separated K/V layout may register its K and V halves apart). ``num_blocks``: blocks in
    the layer's cache (a separated layout's V half starts after this many blocks).
    ``block_len``: bytes of one block in one region; ``block_stride``: bytes from one
    block's start to the next's (at least ``block_len``; 0 when the peer did not say).
    ``span``: the index, in the handshake's ``spans``, of the whole allocation the layer's
    region lies in (-1: none), and ``span_offset`` the region's byte offset in it: a peer
    may then move every layer of a request in one batch against the span.
    ``slices``: per KV-cache group, where this rank's shard of a page lies (the wire form of
    a :class:`~moriio.domain.kv.head_slices.SliceLayout`; empty: the group's pages move
    only whole), so a peer of another TP size can slice them.
    """

    name: str
    descriptors: tuple[bytes, ...]
    num_blocks: int
    block_len: int
    block_stride: int = 0
    span: int = -1
    span_offset: int = 0
    slices: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        require_text("layer name", self.name)
        if not isinstance(self.descriptors, tuple) or not all(
            isinstance(d, bytes) for d in self.descriptors
        ):
            raise ValueError(f"descriptors of layer {self.name!r} must be a tuple of bytes")
        if not self.descriptors:
            raise ValueError(f"layer {self.name!r} needs at least one region descriptor")
        require_positive(f"num_blocks of layer {self.name!r}", self.num_blocks)
        require_positive(f"block_len of layer {self.name!r}", self.block_len)
        stride = self.block_stride
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 0:
            raise ValueError(f"block_stride of layer {self.name!r} must be an int >= 0")
        for name, value, low in (("span", self.span, -1), ("span_offset", self.span_offset, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} of layer {self.name!r} must be an int >= {low}")
        for wire in self.slices:
            if wire:
                SliceLayout.from_wire(wire)  # ValueError names what is wrong
        if 0 < stride < self.block_len:
            raise ValueError(
                f"block_stride {stride} of layer {self.name!r} is below its block_len "
                f"{self.block_len}: blocks would overlap"
            )
