"""Segment copies in host memory (the :class:`~moriio.ports.SegmentCopier` of host KV).

Each segment is one ``memmove`` between the two regions' bytes, in the calling thread: the
copy is complete when :meth:`HostSegmentCopier.copy` returns.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from moriio.ports import LocalRegion, MemoryKind, TransferEngineError
from moriio.ports.batch import check_batch

if TYPE_CHECKING:
    from moriio.ports import SegmentCopier
    from moriio.ports.transfer_engine import Offsets


class Copied:
    """A copy that already ran."""

    def query(self) -> bool:
        return True


COPIED = Copied()


class HostSegmentCopier:
    """Copies segments between two host regions of this process (see the module docstring)."""

    def copy(
        self,
        dst: LocalRegion,
        src: LocalRegion,
        dst_offsets: Offsets,
        src_offsets: Offsets,
        sizes: Offsets,
    ) -> Copied:
        for region in (dst, src):
            if region.kind is not MemoryKind.HOST:
                raise TransferEngineError(
                    f"region {region.region_id} is {region.kind.value} memory: host copies "
                    "move host memory only"
                )
        dst_off, src_off, size = check_batch(
            dst_offsets, src_offsets, sizes, dst.length, src.length
        )
        for d, s, n in zip(
            (dst_off + dst.addr).tolist(), (src_off + src.addr).tolist(), size.tolist(), strict=True
        ):
            ctypes.memmove(d, s, n)
        return COPIED


if TYPE_CHECKING:

    def _conforms(copier: HostSegmentCopier) -> SegmentCopier:
        return copier
