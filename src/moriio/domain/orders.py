"""Per-step orders from the scheduler-side connector to its workers.

Each step carries only what changed (deltas), never the whole live transfer map.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from moriio.domain.routing import PeerEndpoint


class TransferMode(enum.Enum):
    READ = "read"  # decode pulls
    WRITE = "write"  # prefill pushes


@dataclass(frozen=True, slots=True)
class ReadOrder:
    """Consumer READ: pull ``remote_block_ids`` into ``local_block_ids`` before this forward."""

    request_id: str
    transfer_id: str
    local_block_ids: tuple[int, ...]
    remote_block_ids: tuple[int, ...]
    peer: PeerEndpoint
    lease_expires_at: float | None


@dataclass(frozen=True, slots=True)
class ReleaseOrder:
    """Consumer: free the producer's blocks without reading (abort, full local prefix hit)."""

    request_id: str
    transfer_id: str
    peer: PeerEndpoint


@dataclass(frozen=True, slots=True)
class ExpectWriteOrder:
    """Consumer WRITE: announce destination blocks to the producer and await ``write_done``.

    ``first_block`` is the index of the first announced block in the request's block list
    (blocks before it are local prefix-cache hits the producer must not overwrite).
    """

    request_id: str
    transfer_id: str
    local_block_ids: tuple[int, ...]
    first_block: int
    peer: PeerEndpoint


@dataclass(frozen=True, slots=True)
class AbortWriteOrder:
    """Consumer WRITE: the request ended while writes may still land in its blocks."""

    request_id: str
    transfer_id: str


@dataclass(frozen=True, slots=True)
class SaveOrder:
    """Producer WRITE: the prefill completes this step; push ``block_ids`` layer by layer."""

    request_id: str
    transfer_id: str
    block_ids: tuple[int, ...]
    peer: PeerEndpoint | None


@dataclass(frozen=True, slots=True)
class HoldOrder:
    """Producer: the request finished; its blocks stay allocated until the transfer ends."""

    request_id: str
    transfer_id: str


class DropReason(enum.Enum):
    EXPIRED = "expired"  # the lease ran out; the scheduler reclaimed the blocks
    CANCELLED = "cancelled"  # the request ended before its KV was handed off


@dataclass(frozen=True, slots=True)
class DropOrder:
    """Producer: forget the request; never report it again."""

    request_id: str
    transfer_id: str
    reason: DropReason


@dataclass(slots=True)
class StepOrders:
    """Everything the workers must start this step."""

    reads: list[ReadOrder] = field(default_factory=list)
    releases: list[ReleaseOrder] = field(default_factory=list)
    expect_writes: list[ExpectWriteOrder] = field(default_factory=list)
    abort_writes: list[AbortWriteOrder] = field(default_factory=list)
    saves: list[SaveOrder] = field(default_factory=list)
    holds: list[HoldOrder] = field(default_factory=list)
    drops: list[DropOrder] = field(default_factory=list)

    def is_empty(self) -> bool:
        """True when there is nothing for the workers to do."""
        return not (
            self.reads
            or self.releases
            or self.expect_writes
            or self.abort_writes
            or self.saves
            or self.holds
            or self.drops
        )
