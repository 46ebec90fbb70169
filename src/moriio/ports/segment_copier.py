"""SegmentCopier port: copy many segments between two registered memories of this process.

A staging region trades a transport's descriptors for local copies: the sender gathers a
request's scattered pieces into its staging region, one large descriptor crosses, the
receiver scatters the pieces out of its own. Each gather or scatter is one call here (on a
device: one kernel launch for every segment), completed asynchronously.
"""

from __future__ import annotations

from typing import Protocol

from moriio.ports.transfer_engine import LocalRegion, Offsets


class CopyDone(Protocol):
    """A copy in flight: complete once every byte of it landed."""

    def query(self) -> bool:
        """Whether the copy has finished (never blocks)."""
        ...


class SegmentCopier(Protocol):
    """Copies ``sizes[i]`` bytes from ``src_offsets[i]`` of ``src`` to ``dst_offsets[i]`` of
    ``dst``, both regions registered in this process (host memory, or one device's).

    Segments of one call never overlap on the destination; the source is only read.
    Out-of-region segments raise ``TransferEngineError`` before any byte moves.
    """

    def copy(
        self,
        dst: LocalRegion,
        src: LocalRegion,
        dst_offsets: Offsets,
        src_offsets: Offsets,
        sizes: Offsets,
    ) -> CopyDone:
        """Start the copy (host memory: done when it returns); poll the result."""
        ...
