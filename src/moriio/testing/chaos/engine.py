"""A TransferEngine wrapper that injects seeded faults into any engine.

Faults are decided per post from the caller's ``random.Random``, so one seed replays the same
faults. Injected BACKPRESSURE, FAILED and hung batches never reach the inner engine (their
descriptors are still range-checked, so misuse raises as it would); a batch that "fails in
flight" or is "slow" runs on the inner engine and only its reported state is altered.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moriio.ports import (
    LocalRegion,
    MemoryKind,
    PeerId,
    RemoteRegion,
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)
from moriio.ports.batch import check_batch
from moriio.testing.chaos.plans import EngineFault, EngineFaultPlan

if TYPE_CHECKING:
    from moriio.ports.transfer_engine import Offsets

_IN_PROGRESS = TransferStatus(TransferState.IN_PROGRESS)
_BACKPRESSURE = TransferStatus(TransferState.BACKPRESSURE, "injected backpressure")
_FAILED = TransferStatus(TransferState.FAILED, "injected transfer failure")
_FAILED_IN_FLIGHT = TransferStatus(TransferState.FAILED, "injected failure after the transfer ran")


@dataclass(slots=True)
class _Batch:
    peer: PeerId
    inner: TransferHandle | None  # None: decided here, never posted to the inner engine
    status: TransferStatus | None  # fixed state (injected), or None: ask the inner engine
    hold: int = 0  # polls still reporting IN_PROGRESS before the inner engine is asked
    fail_when_done: bool = False


class ChaosTransferEngine:
    """Wraps ``inner`` and injects the faults of ``plan``; counts them in :attr:`injected`."""

    def __init__(self, inner: TransferEngine, rng: random.Random, plan: EngineFaultPlan) -> None:
        self._inner = inner
        self._rng = rng
        self._plan = plan
        self._lock = threading.Lock()
        self._batches: dict[TransferHandle, _Batch] = {}
        self._next_handle = 1
        self._burst_left = 0
        self._injected: Counter[str] = Counter()

    # -- knobs -------------------------------------------------------------------------------

    @property
    def inner(self) -> TransferEngine:
        return self._inner

    @property
    def plan(self) -> EngineFaultPlan:
        return self._plan

    @plan.setter
    def plan(self, plan: EngineFaultPlan) -> None:
        with self._lock:
            self._plan = plan
            self._burst_left = 0

    @property
    def injected(self) -> Mapping[str, int]:
        """Faults injected so far, by :class:`EngineFault` name."""
        with self._lock:
            return dict(self._injected)

    @property
    def num_batches(self) -> int:
        """Batches posted and not yet released."""
        with self._lock:
            return len(self._batches)

    # -- TransferEngine: delegated -------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._inner.name

    def metadata(self) -> bytes:
        return self._inner.metadata()

    def register_region(
        self, addr: int, length: int, kind: MemoryKind = MemoryKind.HOST, device_id: int = 0
    ) -> LocalRegion:
        return self._inner.register_region(addr, length, kind, device_id)

    def deregister_region(self, region: LocalRegion) -> None:
        self._inner.deregister_region(region)

    def add_peer(self, metadata: bytes) -> PeerId:
        return self._inner.add_peer(metadata)

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        return self._inner.import_region(peer, descriptor)

    def progress(self) -> None:
        self._inner.progress()

    def remove_peer(self, peer: PeerId) -> None:
        """Forget ``peer``; injected batches to it that never ended fail, like real ones."""
        self._inner.remove_peer(peer)
        with self._lock:
            for batch in self._batches.values():
                if batch.peer == peer and batch.status is _IN_PROGRESS:
                    batch.status = TransferStatus(TransferState.FAILED, f"peer {peer} was removed")

    def close(self) -> None:
        with self._lock:
            self._batches.clear()
        self._inner.close()

    # -- TransferEngine: with faults -----------------------------------------------------------

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
        with self._lock:
            fault = self._draw() if len(sizes) else None
            if fault is not None:
                self._injected[fault] += 1
            if fault in (EngineFault.BACKPRESSURE, EngineFault.FAILED, EngineFault.HUNG):
                check_batch(local_offsets, remote_offsets, sizes, local.length, remote.length)
                status = {
                    EngineFault.BACKPRESSURE: _BACKPRESSURE,
                    EngineFault.FAILED: _FAILED,
                    EngineFault.HUNG: _IN_PROGRESS,
                }[fault]
                return self._add(_Batch(remote.peer, None, status))
            hold = self._rng.randint(1, self._plan.slow_polls) if fault is EngineFault.SLOW else 0
        inner = self._inner.post(op, local, remote, local_offsets, remote_offsets, sizes, tag)
        with self._lock:
            batch = _Batch(
                remote.peer,
                inner,
                None,
                hold=hold,
                fail_when_done=fault is EngineFault.FAILED_IN_FLIGHT,
            )
            return self._add(batch)

    def poll(self, handle: TransferHandle) -> TransferStatus:
        with self._lock:
            batch = self._batches.get(handle)
            if batch is None:
                raise TransferEngineError(f"unknown or released transfer handle {handle}")
            if batch.status is not None:
                return batch.status
            if batch.hold > 0:
                batch.hold -= 1
                return _IN_PROGRESS
            inner = batch.inner
        assert inner is not None
        status = self._inner.poll(inner)
        if batch.fail_when_done and status.state is not TransferState.IN_PROGRESS:
            with self._lock:
                batch.status = _FAILED_IN_FLIGHT
            return _FAILED_IN_FLIGHT
        return status

    def release(self, handle: TransferHandle) -> None:
        """Forget ``handle`` (and its inner batch); unknown handles are ignored."""
        with self._lock:
            batch = self._batches.pop(handle, None)
        if batch is not None and batch.inner is not None:
            self._inner.release(batch.inner)

    # -- internals -----------------------------------------------------------------------------

    def _add(self, batch: _Batch) -> TransferHandle:
        handle = TransferHandle(self._next_handle)
        self._next_handle += 1
        self._batches[handle] = batch
        return handle

    def _draw(self) -> EngineFault | None:
        if self._burst_left > 0:
            self._burst_left -= 1
            return EngineFault.BACKPRESSURE
        plan = self._plan
        r = self._rng.random()
        for fault, p in (
            (EngineFault.BACKPRESSURE, plan.backpressure),
            (EngineFault.FAILED, plan.failed),
            (EngineFault.FAILED_IN_FLIGHT, plan.failed_in_flight),
            (EngineFault.HUNG, plan.hung),
            (EngineFault.SLOW, plan.slow),
        ):
            if r < p:
                if fault is EngineFault.BACKPRESSURE:
                    self._burst_left = self._rng.randint(1, plan.burst_max) - 1
                return fault
            r -= p
        return None


if TYPE_CHECKING:

    def _conforms(engine: ChaosTransferEngine) -> TransferEngine:
        return engine
