"""TransferEngine port: one-sided RDMA-style READ/WRITE between registered regions.

Offsets are bytes from the start of a registered region. Completion is polled, never
pushed: ``post`` returns a handle at once and ``poll`` reports its state without blocking.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType, Protocol

import numpy as np
import numpy.typing as npt

PeerId = NewType("PeerId", str)
"""Name of a remote engine, as returned by :meth:`TransferEngine.add_peer`."""

TransferHandle = NewType("TransferHandle", int)
"""Opaque id of one posted batch."""


class TransferEngineError(RuntimeError):
    """Misuse of an engine: unknown region or peer, out-of-range offsets, closed engine."""


class TransferOp(enum.Enum):
    READ = "read"  # remote -> local
    WRITE = "write"  # local -> remote


class MemoryKind(enum.Enum):
    HOST = "host"
    DEVICE = "device"


class TransferState(enum.Enum):
    IN_PROGRESS = "in_progress"
    SUCCEEDED = "succeeded"
    BACKPRESSURE = "backpressure"  # transient (e.g. RDMA send queue full): re-post later
    FAILED = "failed"  # terminal

    @property
    def is_terminal(self) -> bool:
        """True for SUCCEEDED and FAILED; BACKPRESSURE needs a re-post, not a poll."""
        return self in (TransferState.SUCCEEDED, TransferState.FAILED)


@dataclass(frozen=True, slots=True)
class TransferStatus:
    state: TransferState
    message: str = ""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One whole allocation that several regions may lie in (e.g. the KV buffer every layer
    of vLLM's cache views): ``length`` bytes at ``addr``."""

    addr: int
    length: int

    def contains(self, addr: int, length: int) -> bool:
        """Whether ``[addr, addr + length)`` lies inside this allocation."""
        return self.addr <= addr and addr + length <= self.addr + self.length


@dataclass(frozen=True, slots=True)
class LocalRegion:
    """A registered local memory region. ``descriptor`` is what a peer needs to import it."""

    region_id: int
    addr: int
    length: int
    kind: MemoryKind
    device_id: int
    descriptor: bytes


@dataclass(frozen=True, slots=True)
class RemoteRegion:
    """A peer's region, imported from its descriptor; only reachable through ``peer``."""

    peer: PeerId
    region_id: int
    length: int


Offsets = npt.NDArray[np.int64]


class TransferEngine(Protocol):
    """One-sided transfer engine (mori IO, NIXL, or an in-memory fake)."""

    @property
    def name(self) -> str:
        """This engine's name as peers know it."""
        ...

    def metadata(self) -> bytes:
        """Opaque bytes a peer passes to :meth:`add_peer` to reach this engine."""
        ...

    def register_region(
        self,
        addr: int,
        length: int,
        kind: MemoryKind = MemoryKind.HOST,
        device_id: int = 0,
        allocation: Allocation | None = None,
    ) -> LocalRegion:
        """Register ``length`` bytes at ``addr`` for transfers.

        ``allocation``: the allocation the range lies in (ValueError when it does not). An
        engine may register that allocation once for every region inside it and hand each
        region out as a view of it; offsets stay relative to ``addr`` either way, a view's
        descriptor reaches only its own range, and the allocation goes back when the last of
        its regions is deregistered. Engines that register per region may ignore it.
        """
        ...

    def deregister_region(self, region: LocalRegion) -> None:
        """Undo :meth:`register_region`."""
        ...

    def add_peer(self, metadata: bytes) -> PeerId:
        """Make a remote engine reachable; idempotent for the same metadata."""
        ...

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        """Turn a peer's region descriptor into something :meth:`post` can target."""
        ...

    def remove_peer(self, peer: PeerId) -> None:
        """Forget a peer and everything imported from it; in-flight transfers to it fail.

        A teardown: once the engine reports their batches :meth:`settled` no byte of them
        lands (the in-memory engine at once; NIXL once UCX ended the requests already
        posted; mori once its queue pairs complete or give up).
        """
        ...

    def post(
        self,
        op: TransferOp,
        local: LocalRegion,
        remote: RemoteRegion,
        local_offsets: Offsets,
        remote_offsets: Offsets,
        sizes: Offsets,
        tag: str,
    ) -> TransferHandle:
        """Post one batch of descriptors. Never blocks on completion.

        Out-of-region descriptors raise :class:`TransferEngineError` before any byte moves.
        A transient refusal (backpressure) or a terminal failure shows in :meth:`poll`.
        """
        ...

    def poll(self, handle: TransferHandle) -> TransferStatus:
        """Current state of a posted batch; never blocks."""
        ...

    def progress(self) -> None:
        """Drive the transport without blocking (serves peers' one-sided operations too)."""
        ...

    def cancel(self, handle: TransferHandle) -> None:
        """Ask the engine to stop a batch still in progress (best effort: it may be lost).

        The batch stays known: its bytes may land until :meth:`settled` says otherwise.
        """
        ...

    def settled(self, handle: TransferHandle) -> bool:
        """Whether no byte of the batch can land any more.

        True once it succeeded, once it failed and the engine knows its work stopped, or once
        its peer was removed (a torn-down connection moves no byte), whatever :meth:`poll`
        still reports.
        """
        ...

    def release(self, handle: TransferHandle) -> None:
        """Forget a batch whose state is no longer needed."""
        ...

    def close(self) -> None:
        """Release every resource; the engine is unusable afterwards."""
        ...
