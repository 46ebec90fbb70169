"""What the NIXL adapter keeps per posted batch, and how a batch becomes NIXL descriptors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from moriio.adapters.nixl.failures import explain
from moriio.domain.kv.descriptors import merged
from moriio.ports import (
    LocalRegion,
    MemoryKind,
    PeerId,
    RemoteRegion,
    TransferOp,
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

    ``settled``: no byte of it can land any more: NIXL reported it DONE or ERR (neither
    freeing its handle nor removing the peer stops what UCX already posted).
    """

    peer: PeerId
    tag: str
    handle: Any | None  # nixl_xfer_handle while NIXL holds resources for it
    status: TransferStatus | None  # set once terminal (or failed by cancel or remove_peer)
    device: bool = False  # device memory on either side
    settled: bool = False
    op: str = ""  # READ or WRITE


def touches_device(mine: Local, theirs: Remote) -> bool:
    """Whether a batch between ``mine`` and ``theirs`` moves device memory on either side."""
    return mine.region.kind is MemoryKind.DEVICE or theirs.mem_type == MEM_TYPES[MemoryKind.DEVICE]


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


def submit(
    agent: Any,
    errors: tuple[type[Exception], ...],
    xfer: Xfer,
    op: TransferOp,
    mine: Local,
    theirs: Remote,
    batch: tuple[Int64s, Int64s, Int64s],
    notif: bytes,
) -> str:
    """Post ``batch`` (local offsets, remote offsets, sizes) on NIXL; its state or error."""
    lo, ro, sz = merged(*batch)
    local_descs = descriptors(mine.region.addr, lo, sz, mine.nixl_device)
    remote_descs = descriptors(theirs.addr, ro, sz, theirs.device_id)
    try:
        xfer.handle = agent.initialize_xfer(
            op.name,
            agent.get_xfer_descs(local_descs, MEM_TYPES[mine.region.kind]),
            agent.get_xfer_descs(remote_descs, theirs.mem_type),
            xfer.peer,
            notif,
        )
        return str(agent.transfer(xfer.handle))
    except errors as exc:
        return f"{type(exc).__name__}: {exc}"


def verdict(
    state: str, when: str, device: bool = False, proven: bool = False
) -> TransferStatus | None:
    """The port's terminal status for NIXL's ``state`` (or an error text); None for PROC.

    ``device``: the batch moves device memory, where a failure may have a named cause
    (:mod:`moriio.adapters.nixl.failures`); ``proven``: a device batch in the same direction
    to the same peer succeeded before, so UCX has a protocol for it and a disconnect is one.
    """
    if state == "PROC":
        return None
    if state == "DONE":
        return SUCCEEDED
    if state == "ERR":
        return TransferStatus(TransferState.FAILED, f"NIXL reported ERR while {when} the transfer")
    message = f"NIXL {when} failed: {state}"
    named = None if proven else explain(message, device)
    return TransferStatus(TransferState.FAILED, named or message)
