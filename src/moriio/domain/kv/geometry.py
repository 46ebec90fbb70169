"""KV-cache geometry values: a layer's spec, its recognised layout and the byte geometry
the planner turns into offsets (see :mod:`moriio.domain.kv.layout`)."""

from __future__ import annotations

import enum
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

LayerKind = Literal["attention", "mla"]


class LayoutKind(enum.Enum):
    MLA = "mla"
    SEPARATED = "separated"
    INTERLEAVED = "interleaved"
    KERNEL_BLOCKS = "kernel_blocks"
    PACKED = "packed"


def positive(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """What the engine says about a layer's cache (vLLM's ``KVCacheSpec``, as plain ints).

    ``num_kv_heads`` / ``head_size`` may be ``None`` (unknown): they then match any size when
    the kernel-block axis is detected and are not checked. For MLA, ``head_size`` is the
    latent width. ``head_size_v`` is the V head size of a packed page when it differs from
    ``head_size``.

    For a page view ``[nb*k, H, N, C]``, ``num_kv_heads`` is H (vLLM's head slots, 1 for MLA),
    ``num_states`` the states of one block (``block_size`` unless a state covers several
    tokens) and ``content_bytes`` the bytes of one (slot, state) cell, scales and packing
    included; ``None`` derives them from the head sizes.
    """

    block_size: int
    num_kv_heads: int | None
    head_size: int | None
    kind: LayerKind = "attention"
    head_size_v: int | None = None
    num_states: int | None = None
    content_bytes: int | None = None

    def __post_init__(self) -> None:
        positive("block_size", self.block_size)
        positive("num_kv_heads", self.num_kv_heads, optional=True)
        positive("head_size", self.head_size, optional=True)
        positive("head_size_v", self.head_size_v, optional=True)
        positive("num_states", self.num_states, optional=True)
        positive("content_bytes", self.content_bytes, optional=True)
        if self.kind not in ("attention", "mla"):
            raise ValueError(f"kind must be 'attention' or 'mla', got {self.kind!r}")

    @property
    def states_per_block(self) -> int:
        return self.num_states or self.block_size

    def content_elements(self) -> int | None:
        """C of a page view in elements when derived from head sizes (``None``: unknown)."""
        if self.head_size is None:
            return None
        if self.kind == "mla":
            return self.head_size
        return self.head_size + (self.head_size_v or self.head_size)


GeometryKey = tuple[tuple[int, ...], tuple[int, ...], int, LayerSpec]
"""``(shape, strides, itemsize, spec)``: every input of :func:`describe_layout`, so equal keys
mean equal geometry (and, for the same block ids, equal plans)."""


@dataclass(frozen=True, slots=True)
class LayerGeometry:
    """Byte geometry of one layer's cache, as the planner needs it.

    Offsets are bytes from the start of the layer's registered tensor. Block ``b``'s first
    chunk starts at ``b * block_stride_bytes``; with two transfers per block its V chunk
    starts ``v_offset_bytes`` further (locally). Every chunk is ``block_len`` bytes.
    ``num_blocks`` counts logical blocks (kernel blocks / ``kernel_blocks_per_block``);
    ``region_len`` is the byte extent of the whole tensor, i.e. what gets registered.
    ``key`` identifies the geometry for plan caching.
    """

    kind: LayoutKind
    num_blocks: int
    block_size: int
    kernel_blocks_per_block: int
    block_len: int
    block_stride_bytes: int
    v_offset_bytes: int
    transfers_per_block: int
    region_len: int
    key: GeometryKey

    @property
    def slot_size_bytes(self) -> int:
        """Bytes per token slot within one chunk."""
        return self.block_len // self.block_size

    @property
    def shape(self) -> tuple[int, ...]:
        return self.key[0]

    @property
    def strides(self) -> tuple[int, ...]:
        return self.key[1]

    @property
    def itemsize(self) -> int:
        return self.key[2]

    def remote_v_offset(self, remote_num_blocks: int, remote_stride: int | None = None) -> int:
        """Offset of the peer's V chunk of block 0 (0 when there is no separate V chunk);
        ``remote_stride``: the peer's block stride when it differs from ours."""
        if self.kind is LayoutKind.SEPARATED:
            return remote_num_blocks * (remote_stride or self.block_stride_bytes)
        return self.v_offset_bytes


def dense_elements(sizes: Sequence[int], strides: Sequence[int]) -> int | None:
    """Element count if the dims form one dense run in some order, else ``None``."""
    expected = 1
    for size, stride in sorted(
        ((n, s) for n, s in zip(sizes, strides, strict=True) if n != 1), key=lambda p: p[1]
    ):
        if stride != expected:
            return None
        expected *= size
    return expected


def matches(want: int | None, got: int) -> bool:
    return want is None or want == got


def as_int_tuple(name: str, values: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of ints, got {values!r}") from None
