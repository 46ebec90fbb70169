"""What the NIXL adapter keeps per posted batch, and how a batch becomes NIXL descriptors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from moriio.ports import (
    LocalRegion,
    MemoryKind,
    PeerId,
    RemoteRegion,
    TransferState,
    TransferStatus,
)
from moriio.ports.batch import Int64s

MEM_TYPES = {MemoryKind.HOST: "DRAM", MemoryKind.DEVICE: "VRAM"}
IN_PROGRESS = TransferStatus(TransferState.IN_PROGRESS)
SUCCEEDED = TransferStatus(TransferState.SUCCEEDED)


@dataclass(slots=True)
class Local:
    region: LocalRegion
    reg_descs: Any  # nixlRegDList returned by register_memory
    nixl_device: int  # NIXL's device id: the GPU for VRAM, 0 for DRAM


@dataclass(frozen=True, slots=True)
class Remote:
    region: RemoteRegion
    addr: int
    device_id: int
    mem_type: str


@dataclass(slots=True, eq=False)
class Xfer:
    """One posted batch.

    ``settled``: no byte of it can land any more. NIXL's DONE says so; ERR does not (other
    requests of the batch may still run) until NIXL frees the handle, which cancels what is
    still active or refuses while it cannot; removing the peer disconnects it.
    """

    peer: PeerId
    tag: str
    handle: Any | None  # nixl_xfer_handle while NIXL holds resources for it
    status: TransferStatus | None  # set once terminal (or failed by cancel or remove_peer)
    settled: bool = False


def descriptors(base: int, offsets: Int64s, sizes: Int64s, device_id: int) -> npt.NDArray[Any]:
    """N x 3 uint64 (absolute address, length, device id), built without a Python loop."""
    if offsets.size == 1:
        return np.array([[base + int(offsets[0]), int(sizes[0]), device_id]], dtype=np.uint64)
    out = np.empty((offsets.size, 3), dtype=np.uint64)
    out[:, 0] = offsets.astype(np.uint64)
    out[:, 0] += np.uint64(base)
    out[:, 1] = sizes
    out[:, 2] = device_id
    return out


def coalesce(local: Int64s, remote: Int64s, sizes: Int64s) -> tuple[Int64s, Int64s, Int64s]:
    """Merge runs of descriptors contiguous on both sides (UCX pays per operation)."""
    if sizes.size < 2:
        return local, remote, sizes
    ends = sizes[:-1]
    joins = (local[:-1] + ends == local[1:]) & (remote[:-1] + ends == remote[1:])
    if not joins.any():
        return local, remote, sizes
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    return local[starts], remote[starts], np.add.reduceat(sizes, starts)


def verdict(state: str, when: str) -> TransferStatus | None:
    """The port's terminal status for NIXL's ``state`` (or an error text); None for PROC."""
    if state == "PROC":
        return None
    if state == "DONE":
        return SUCCEEDED
    if state == "ERR":
        return TransferStatus(TransferState.FAILED, f"NIXL reported ERR while {when} the transfer")
    return TransferStatus(TransferState.FAILED, f"NIXL {when} failed: {state}")
