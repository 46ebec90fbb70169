"""Region descriptors of the mori adapter, and views into one registered allocation.

A region registered alone is described by its mori ``MemoryDesc.pack()`` bytes. A region that
lies in an allocation registered once (vLLM's one shared KV buffer) is a *view*: its
descriptor carries the view's id, its byte offset inside the allocation and its length, then
the allocation's packed ``MemoryDesc``, so a peer imports each allocation once and addresses
the view's bytes at ``offset + base``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_MAGIC = b"moriio-view\x00"
_HEAD = struct.Struct("<QQQ")  # region id, base offset, length

VIEW_IDS = 1 << 32
"""First id of a view; mori's own memory ids are 32-bit, so the two never meet."""


@dataclass(frozen=True, slots=True)
class View:
    """A region inside a registered allocation, as a descriptor names it."""

    region_id: int
    base: int  # byte offset of the region inside the allocation
    length: int
    memory: bytes  # the allocation's packed MemoryDesc


def encode_view(view: View) -> bytes:
    return _MAGIC + _HEAD.pack(view.region_id, view.base, view.length) + view.memory


def decode_view(descriptor: bytes) -> View | None:
    """The view a descriptor names; None for a plain ``MemoryDesc``; ValueError if cut short."""
    if not descriptor.startswith(_MAGIC):
        return None
    head = descriptor[len(_MAGIC) : len(_MAGIC) + _HEAD.size]
    if len(head) != _HEAD.size:
        raise ValueError("malformed mori view descriptor: truncated")
    region_id, base, length = _HEAD.unpack(head)
    if region_id < VIEW_IDS or length <= 0:
        raise ValueError(f"malformed mori view descriptor: id {region_id}, length {length}")
    return View(region_id, base, length, descriptor[len(_MAGIC) + _HEAD.size :])
