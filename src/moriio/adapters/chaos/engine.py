"""A TransferEngine wrapper that injects seeded faults into any engine.

Faults are decided per post from the caller's ``random.Random``, so one seed replays the same
faults. Injected BACKPRESSURE, FAILED and hung batches never reach the inner engine (their
descriptors are still range-checked, so misuse raises as it would); a batch that "fails in
flight" or is "slow" runs on the inner engine and only its reported state is altered. A
"late" batch reaches the inner engine only when its landing time comes (on the wrapper's
clock), whoever drives the wrapper then: a DMA lands whether or not its owner polls.

``on_land`` (optional) hears of every batch whose bytes moved, when the wrapper learns it.
:meth:`ChaosTransferEngine.retire` injects a NIC fault when its caller (the simulation) says.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from moriio.adapters.chaos.batches import (
    BACKPRESSURE,
    CANCELLED,
    FAILED,
    FAILED_IN_FLIGHT,
    IN_PROGRESS,
    REJECTED,
    RETIRED,
    Batch,
    Post,
)
from moriio.adapters.chaos.plans import EngineFault, EngineFaultPlan
from moriio.ports import (
    Allocation,
    Clock,
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

if TYPE_CHECKING:
    from moriio.ports.transfer_engine import Offsets


class ChaosTransferEngine:
    """Wraps ``inner`` and injects the faults of ``plan``; counts them in :attr:`injected`."""

    def __init__(
        self,
        inner: TransferEngine,
        rng: random.Random,
        plan: EngineFaultPlan,
        clock: Clock | None = None,
    ) -> None:
        self._inner = inner
        self._rng = rng
        self._plan = plan
        self._clock = clock
        self.on_land: Callable[[Post], None] | None = None
        self._lock = threading.Lock()
        self._batches: dict[TransferHandle, Batch] = {}
        self._orphans: list[Batch] = []  # released late batches that will still land
        self._next_handle = 1
        self._burst_left = 0
        self._rejecting = 0  # posts still refused after a retirement
        self.retired_landings = 0  # retired batches whose bytes landed after they failed
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
        self,
        addr: int,
        length: int,
        kind: MemoryKind = MemoryKind.HOST,
        device_id: int = 0,
        allocation: Allocation | None = None,
    ) -> LocalRegion:
        return self._inner.register_region(addr, length, kind, device_id, allocation)

    def deregister_region(self, region: LocalRegion) -> None:
        self._inner.deregister_region(region)

    def add_peer(self, metadata: bytes) -> PeerId:
        return self._inner.add_peer(metadata)

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        return self._inner.import_region(peer, descriptor)

    def progress(self) -> None:
        self.land_due()
        self._inner.progress()

    def remove_peer(self, peer: PeerId) -> None:
        """Forget ``peer``: none of its batches moves a byte any more; those not ended fail,
        like real ones (or, injected, keep reporting IN_PROGRESS)."""
        self._inner.remove_peer(peer)
        with self._lock:
            for batch in self._all():
                if batch.peer != peer or batch.peer_removed:
                    continue
                batch.peer_removed, batch.land_at = True, None
                if self._chance(self._plan.stuck_after_remove):
                    batch.stuck = True
                    self._injected[EngineFault.STUCK_AFTER_REMOVE] += 1
                elif batch.status is IN_PROGRESS:
                    batch.status = TransferStatus(TransferState.FAILED, f"peer {peer} was removed")

    def close(self) -> None:
        with self._lock:
            self._batches.clear()
            self._orphans.clear()
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
        self.land_due()
        post = Post(op, local, remote, local_offsets, remote_offsets, sizes, tag)
        with self._lock:
            if self._rejecting and len(sizes):
                check_batch(local_offsets, remote_offsets, sizes, local.length, remote.length)
                self._rejecting -= 1
                return self._add(Batch(post, None, REJECTED))
            fault = self._draw() if len(sizes) else None
            if fault is not None:
                self._injected[fault] += 1
            if fault is EngineFault.LATE:
                check_batch(local_offsets, remote_offsets, sizes, local.length, remote.length)
                if self._clock is None:
                    raise TransferEngineError("late batches need the chaos engine's clock")
                delay = self._rng.uniform(0, self._plan.late_max)
                return self._add(Batch(post, None, IN_PROGRESS, land_at=self._now() + delay))
            if fault in (EngineFault.BACKPRESSURE, EngineFault.FAILED, EngineFault.HUNG):
                check_batch(local_offsets, remote_offsets, sizes, local.length, remote.length)
                status = {
                    EngineFault.BACKPRESSURE: BACKPRESSURE,
                    EngineFault.FAILED: FAILED,
                    EngineFault.HUNG: IN_PROGRESS,
                }[fault]
                return self._add(Batch(post, None, status))
            hold = self._rng.randint(1, self._plan.slow_polls) if fault is EngineFault.SLOW else 0
        inner = self._inner.post(op, local, remote, local_offsets, remote_offsets, sizes, tag)
        with self._lock:
            batch = Batch(
                post,
                inner,
                None,
                hold=hold,
                fail_when_done=fault is EngineFault.FAILED_IN_FLIGHT,
            )
            return self._add(batch)

    def poll(self, handle: TransferHandle) -> TransferStatus:
        self.land_due()
        with self._lock:
            batch = self._known(handle)
            if batch.stuck:
                return IN_PROGRESS
            if batch.status is not None:
                return batch.status
            if batch.hold > 0:
                batch.hold -= 1
                return IN_PROGRESS
            inner = batch.inner
        assert inner is not None
        status = self._inner.poll(inner)
        if status.state is TransferState.SUCCEEDED:
            self._landed(batch)
        if batch.fail_when_done and status.state is not TransferState.IN_PROGRESS:
            with self._lock:
                batch.status = FAILED_IN_FLIGHT
            return FAILED_IN_FLIGHT
        return status

    def cancel(self, handle: TransferHandle) -> None:
        """Cancel on the inner engine (injected batches: stop here), unless the cancel is
        drawn lost."""
        with self._lock:
            batch = self._known(handle)
            if self._chance(self._plan.lost_cancel):
                self._injected[EngineFault.LOST_CANCEL] += 1
                return
            if batch.status is IN_PROGRESS:
                batch.status, batch.land_at = CANCELLED, None
                return
            inner = batch.inner
        if inner is not None:
            self._inner.cancel(inner)

    def settled(self, handle: TransferHandle) -> bool:
        self.land_due()
        with self._lock:
            batch = self._known(handle)
            landing = batch.land_at is not None and not batch.peer_removed
            if batch.inner is None:  # injected: hung, or late and not landed, until removed
                return batch.peer_removed or (batch.status is not IN_PROGRESS and not landing)
            if landing:  # retired in flight: its bytes may still land
                return False
            inner = batch.inner
        return self._inner.settled(inner)  # whatever a teardown means to that engine

    def land_due(self) -> None:
        """Land every late batch whose time came (bytes move now)."""
        if self._clock is None:
            return
        now = self._now()
        with self._lock:
            due = [b for b in self._all() if b.land_at is not None and b.land_at <= now]
            for batch in due:
                batch.land_at = None
            orphans = [b for b in due if b in self._orphans]
            self._orphans = [b for b in self._orphans if b.land_at is not None]
        for batch in due:
            if batch.inner is None:
                self._land(batch)
            else:
                self._finish_retired(batch)
        for batch in orphans:
            if batch.inner is not None:
                self._inner.release(batch.inner)

    def release(self, handle: TransferHandle) -> None:
        """Forget ``handle`` (and its inner batch); unknown handles are ignored.

        A late batch released before it landed still lands: forgetting a handle stops no DMA.
        """
        with self._lock:
            batch = self._batches.pop(handle, None)
            if batch is not None and batch.land_at is not None:
                self._orphans.append(batch)
                return
        if batch is not None and batch.inner is not None:
            self._inner.release(batch.inner)

    def retire(self, rng: random.Random) -> int:
        """A NIC fault retires every connection: each batch not ended fails now, its bytes
        landing up to ``late_max`` later (``rng`` draws when) unless its peer is removed first,
        and the next post is refused before anything is posted. Returns the batches failed."""
        window = self._plan.late_max or 0.05
        failed = 0
        with self._lock:
            self._injected[EngineFault.RETIRED] += 1
            self._rejecting = 1
            for batch in self._all():
                if batch.peer_removed or batch.retired or batch.landed:
                    continue
                if batch.inner is None and batch.status is not IN_PROGRESS:
                    continue  # decided here already: nothing of it is in flight
                batch.retired, batch.status = True, RETIRED
                if batch.inner is not None and self._clock is not None:
                    batch.land_at = self._now() + rng.uniform(0, window)
                failed += 1
        return failed

    # -- internals -----------------------------------------------------------------------------

    def _finish_retired(self, batch: Batch) -> None:
        """A retired batch's time came: what of it was still posted lands now."""
        assert batch.inner is not None
        for _ in range(64):  # the inner engine may hold a completion back for a few polls
            if (state := self._inner.poll(batch.inner).state) is not TransferState.IN_PROGRESS:
                break
        if state is TransferState.SUCCEEDED:
            self.retired_landings += 1
            self._landed(batch)

    def _chance(self, p: float) -> bool:
        """A draw with probability ``p`` (none at 0: plans without it replay unchanged)."""
        return p > 0 and self._rng.random() < p

    def _all(self) -> list[Batch]:
        return [*self._batches.values(), *self._orphans]

    def _known(self, handle: TransferHandle) -> Batch:
        batch = self._batches.get(handle)
        if batch is None:
            raise TransferEngineError(f"unknown or released transfer handle {handle}")
        return batch

    def _now(self) -> float:
        assert self._clock is not None
        return self._clock.now()

    def _land(self, batch: Batch) -> None:
        """A late batch's time came: run it on the inner engine now."""
        p = batch.post
        try:
            inner = self._inner.post(
                p.op, p.local, p.remote, p.local_offsets, p.remote_offsets, p.sizes, p.tag
            )
        except TransferEngineError as exc:
            with self._lock:
                if batch.status is IN_PROGRESS:
                    batch.status = TransferStatus(
                        TransferState.FAILED, f"late batch refused: {exc}"
                    )
            return
        with self._lock:
            cancelled = batch.status is not IN_PROGRESS and not batch.retired
            if not cancelled:
                batch.inner = inner
                batch.status = batch.status if batch.retired else None
        if cancelled:
            self._inner.release(inner)
        elif self._inner.poll(inner).state is TransferState.SUCCEEDED:
            self.retired_landings += batch.retired
            self._landed(batch)  # the in-memory engine moves the bytes on that poll

    def _landed(self, batch: Batch) -> None:
        if not batch.landed:
            batch.landed = True
            if self.on_land is not None:
                self.on_land(batch.post)

    def _add(self, batch: Batch) -> TransferHandle:
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
            (EngineFault.LATE, plan.late),
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
