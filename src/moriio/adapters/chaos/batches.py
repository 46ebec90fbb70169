"""The chaos engine's record of one batch, and the states it reports on its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moriio.ports import (
    LocalRegion,
    PeerId,
    RemoteRegion,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)

if TYPE_CHECKING:
    from moriio.ports.transfer_engine import Offsets

IN_PROGRESS = TransferStatus(TransferState.IN_PROGRESS)
BACKPRESSURE = TransferStatus(TransferState.BACKPRESSURE, "injected backpressure")
FAILED = TransferStatus(TransferState.FAILED, "injected transfer failure")
FAILED_IN_FLIGHT = TransferStatus(TransferState.FAILED, "injected failure after the transfer ran")


CANCELLED = TransferStatus(TransferState.FAILED, "cancelled in progress")
RETIRED = TransferStatus(
    TransferState.FAILED,
    "injected NIC fault: its connection was retired (bytes already posted may still land)",
)
REJECTED = TransferStatus(
    TransferState.BACKPRESSURE,
    "injected NIC fault: refused before anything was posted; re-post on a new connection",
)


@dataclass(frozen=True, slots=True)
class Post:
    """The arguments of one post (what landed, for ``on_land``)."""

    op: TransferOp
    local: LocalRegion
    remote: RemoteRegion
    local_offsets: Offsets
    remote_offsets: Offsets
    sizes: Offsets
    tag: str


@dataclass(slots=True, eq=False)
class Batch:
    post: Post
    inner: TransferHandle | None  # None: decided here, never posted to the inner engine
    status: TransferStatus | None  # fixed state (injected), or None: ask the inner engine
    hold: int = 0  # polls still reporting IN_PROGRESS before the inner engine is asked
    fail_when_done: bool = False
    land_at: float | None = None  # a late batch not landed yet: when it lands
    landed: bool = False  # on_land was told
    peer_removed: bool = False
    stuck: bool = False  # reports IN_PROGRESS for ever (its peer was removed)
    retired: bool = False  # failed by a NIC fault while in flight: its bytes may still land

    @property
    def peer(self) -> PeerId:
        return self.post.remote.peer
