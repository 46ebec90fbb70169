"""In-memory TransferEngine: really copies bytes between buffers registered in one process.

Engines find each other through an :class:`InMemoryFabric` that the caller creates and hands
to every engine (there is no module-level registry). Behaviour is steered by explicit knobs:

* ``complete_after_polls`` (+ ``jitter_polls`` drawn from a ``seed``-ed RNG): how many polls
  report IN_PROGRESS before a batch completes; bytes move on the completing poll;
* :meth:`InMemoryTransferEngine.inject_backpressure`: the next K posts report BACKPRESSURE;
* :meth:`InMemoryTransferEngine.inject_failures`: the next M posts fail terminally;
* ``hang``: while set, new posts never complete, until :meth:`~InMemoryTransferEngine.land_hung`
  completes them late (their bytes move then, as a DMA that outlived its timeout);
* ``cancels_stop_batches``: :meth:`~InMemoryTransferEngine.cancel` fails a batch in progress
  before any byte moves; unset (the default, as NIXL and mori behave) the batch runs on;
* ``serves_only_when_progressed`` (on a target): a peer's batch against it completes only
  after it called :meth:`~InMemoryTransferEngine.progress` since the post, as NIXL over
  UCX/TCP behaves;
* a batch released while in progress still lands (as posted work does on a real transport):
  at once, or at :meth:`~InMemoryTransferEngine.land_hung` if it hangs;
* ``stuck_after_remove``: batches to a removed peer keep reporting IN_PROGRESS (they are
  settled all the same: a removed peer's batches never move a byte).

Everything that happens is recorded in ``posted``, ``released``, ``cancelled``, ``polls``
and ``progress_calls``.
"""

from __future__ import annotations

import ctypes
import json
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from moriio.ports import (
    Allocation,
    LocalRegion,
    MemoryKind,
    PeerId,
    RemoteRegion,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)
from moriio.ports.batch import Int64s, check_registration
from moriio.ports.post_checks import check_import, check_post, known_batch
from moriio.testing.inmemory.fabric import InMemoryFabric, PostRecord, decode_fields

if TYPE_CHECKING:
    from moriio.ports import TransferEngine
    from moriio.ports.transfer_engine import Offsets

_IN_PROGRESS = TransferStatus(TransferState.IN_PROGRESS)
_SUCCEEDED = TransferStatus(TransferState.SUCCEEDED)


@dataclass(slots=True)
class _Batch:
    record: PostRecord
    polls_left: int  # -1: never completes (hang)
    status: TransferStatus
    target_progress_at_post: int  # the target's progress calls when the batch was posted
    peer_removed: bool = False  # torn down: no byte of it moves any more


def _frozen(array: Int64s) -> Int64s:
    copy = np.array(array, dtype=np.int64, copy=True)
    copy.setflags(write=False)
    return copy


class InMemoryTransferEngine:
    """A :class:`~moriio.ports.TransferEngine` over process memory, with fault knobs."""

    def __init__(
        self,
        name: str,
        fabric: InMemoryFabric,
        *,
        complete_after_polls: int = 0,
        jitter_polls: int = 0,
        seed: int | None = 0,
    ) -> None:
        if complete_after_polls < 0 or jitter_polls < 0:
            raise ValueError("complete_after_polls and jitter_polls must be >= 0")
        self._name = name
        self._fabric = fabric
        self.complete_after_polls = complete_after_polls
        self.jitter_polls = jitter_polls
        self.hang = False
        self.cancels_stop_batches = False
        self.stuck_after_remove = False
        self.serves_only_when_progressed = False
        self.posted: list[PostRecord] = []
        self.released: list[TransferHandle] = []
        self.cancelled: list[TransferHandle] = []  # cancels that stopped a batch
        self.polls = 0
        self.progress_calls = 0
        self._rng = random.Random(seed)
        self._backpressure_left = 0
        self._failures_left = 0
        self._failure_message = ""
        self._lock = fabric.lock
        self._regions: dict[int, LocalRegion] = {}
        self._peers: set[PeerId] = set()
        self._imported: dict[tuple[PeerId, int], RemoteRegion] = {}
        self._batches: dict[TransferHandle, _Batch] = {}
        self._released_hung: list[_Batch] = []  # released in progress: they land late
        self._next_region = 1
        self._next_handle = 1
        self._closed = False
        fabric.attach(self)

    # -- knobs -------------------------------------------------------------------------------

    def inject_backpressure(self, count: int) -> None:
        """The next ``count`` posts report BACKPRESSURE and move no bytes."""
        with self._lock:
            self._backpressure_left = count

    def inject_failures(self, count: int, message: str = "injected transfer failure") -> None:
        """The next ``count`` posts fail terminally with ``message`` and move no bytes."""
        with self._lock:
            self._failures_left = count
            self._failure_message = message

    def land_hung(self) -> int:
        """Complete every hung batch now (bytes move): late completions. Returns how many."""
        with self._lock:
            late = [
                b
                for b in (*self._batches.values(), *self._released_hung)
                if b.polls_left < 0
                and b.status.state is TransferState.IN_PROGRESS
                and not b.peer_removed
            ]
            for batch in late:
                batch.status, batch.polls_left = self._complete(batch.record), 0
            self._released_hung.clear()
            return len(late)

    # -- TransferEngine ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    def metadata(self) -> bytes:
        self._check_open()
        return json.dumps({"engine": self._name}).encode()

    def register_region(
        self,
        addr: int,
        length: int,
        kind: MemoryKind = MemoryKind.HOST,
        device_id: int = 0,
        allocation: Allocation | None = None,
    ) -> LocalRegion:
        """Registers per region: ``allocation`` is only checked."""
        check_registration(addr, length, allocation)
        with self._lock:
            self._check_open()
            region_id = self._next_region
            self._next_region += 1
            descriptor = json.dumps(
                {"engine": self._name, "region": region_id, "length": length}
            ).encode()
            region = LocalRegion(region_id, addr, length, kind, device_id, descriptor)
            self._regions[region_id] = region
            return region

    def deregister_region(self, region: LocalRegion) -> None:
        with self._lock:
            self._check_open()
            if self._regions.get(region.region_id) != region:
                raise TransferEngineError(f"region {region.region_id} is not registered here")
            del self._regions[region.region_id]

    def add_peer(self, metadata: bytes) -> PeerId:
        name = str(decode_fields(metadata, "engine metadata")["engine"])
        with self._lock:
            self._check_open()
            if self._fabric.find(name) is None:
                raise TransferEngineError(f"no engine named {name!r} on this fabric")
            peer = PeerId(name)
            self._peers.add(peer)
            return peer

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        fields = decode_fields(descriptor, "region descriptor")
        with self._lock:
            self._check_open()
            check_import(peer, peer in self._peers, fields["engine"])
            remote = RemoteRegion(peer, int(fields["region"]), int(fields["length"]))
            self._imported[(peer, remote.region_id)] = remote
            return remote

    def remove_peer(self, peer: PeerId) -> None:
        with self._lock:
            self._check_open()
            self._peers.discard(peer)
            for key in [k for k in self._imported if k[0] == peer]:
                del self._imported[key]
            for batch in self._batches.values():
                if batch.record.peer != peer or batch.status.state is not TransferState.IN_PROGRESS:
                    continue
                batch.peer_removed, batch.polls_left = True, -1
                if not self.stuck_after_remove:
                    batch.status = TransferStatus(TransferState.FAILED, f"peer {peer} was removed")

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
            self._check_open()
            registered = self._regions.get(local.region_id)
            imported = self._imported.get((remote.peer, remote.region_id))
            lo, ro, sz = check_post(
                local, registered, remote, imported, local_offsets, remote_offsets, sizes
            )
            handle = TransferHandle(self._next_handle)
            self._next_handle += 1
            status, polls_left = self._admit(sz.size)
            record = PostRecord(
                handle,
                op,
                local.region_id,
                remote.peer,
                remote.region_id,
                _frozen(lo),
                _frozen(ro),
                _frozen(sz),
                tag,
                status.state,
            )
            self.posted.append(record)
            target = self._fabric.find(remote.peer)
            progressed = -1 if target is None else target.progress_calls
            self._batches[handle] = _Batch(record, polls_left, status, progressed)
            return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        with self._lock:
            self._check_open()
            batch = known_batch(self._batches, handle)
            self.polls += 1
            if batch.status.state is not TransferState.IN_PROGRESS or batch.polls_left < 0:
                return batch.status
            if batch.polls_left > 0:
                batch.polls_left -= 1
                return batch.status
            if self._waits_for_target(batch):
                return batch.status
            batch.status = self._complete(batch.record)
            return batch.status

    def progress(self) -> None:
        """Nothing to drive in memory; counted in ``progress_calls``."""
        with self._lock:
            self._check_open()
            self.progress_calls += 1

    def cancel(self, handle: TransferHandle) -> None:
        """Recorded; with ``cancels_stop_batches`` a batch in progress fails, no byte moves."""
        with self._lock:
            self._check_open()
            batch = known_batch(self._batches, handle)
            if (
                batch.status.state is TransferState.IN_PROGRESS
                and not batch.peer_removed
                and self.cancels_stop_batches
            ):
                batch.status = TransferStatus(TransferState.FAILED, "cancelled in progress")
                self.cancelled.append(handle)

    def settled(self, handle: TransferHandle) -> bool:
        with self._lock:
            self._check_open()
            batch = known_batch(self._batches, handle)
            return batch.peer_removed or batch.status.state is not TransferState.IN_PROGRESS

    def release(self, handle: TransferHandle) -> None:
        """Forget ``handle``; releasing an unknown or released handle does nothing. A batch
        still in progress lands all the same: now, or late if it hangs."""
        with self._lock:
            batch = self._batches.pop(handle, None)
            if batch is None:
                return
            self.released.append(handle)
            if batch.status.state is TransferState.IN_PROGRESS and not batch.peer_removed:
                if batch.polls_left < 0:
                    self._released_hung.append(batch)
                elif not self._closed:
                    batch.status = self._complete(batch.record)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._fabric.detach(self._name)
            self._batches.clear()
            self._imported.clear()
            self._peers.clear()
            self._regions.clear()

    # -- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransferEngineError(f"engine {self._name!r} is closed")

    def _waits_for_target(self, batch: _Batch) -> bool:
        target = self._fabric.find(batch.record.peer)
        return (
            target is not None
            and target.serves_only_when_progressed
            and target.progress_calls <= batch.target_progress_at_post
        )

    def _admit(self, count: int) -> tuple[TransferStatus, int]:
        if count == 0:
            return _SUCCEEDED, 0
        if self._backpressure_left > 0:
            self._backpressure_left -= 1
            return TransferStatus(TransferState.BACKPRESSURE, "injected backpressure"), 0
        if self._failures_left > 0:
            self._failures_left -= 1
            return TransferStatus(TransferState.FAILED, self._failure_message), 0
        if self.hang:
            return _IN_PROGRESS, -1
        jitter = self._rng.randint(0, self.jitter_polls) if self.jitter_polls else 0
        return _IN_PROGRESS, self.complete_after_polls + jitter

    def _complete(self, record: PostRecord) -> TransferStatus:
        peer = self._fabric.find(record.peer)
        if peer is None:
            return TransferStatus(TransferState.FAILED, f"peer {record.peer} is unreachable")
        remote = peer.registered_region(record.remote_region)
        local = self._regions.get(record.local_region)
        if remote is None or local is None:
            which = "remote" if remote is None else "local"
            return TransferStatus(TransferState.FAILED, f"{which} region is no longer registered")
        if record.op is TransferOp.READ:
            src, src_offsets, dst, dst_offsets = (
                remote.addr,
                record.remote_offsets,
                local.addr,
                record.local_offsets,
            )
        else:
            src, src_offsets, dst, dst_offsets = (
                local.addr,
                record.local_offsets,
                remote.addr,
                record.remote_offsets,
            )
        for d, s, n in zip(
            (dst_offsets + dst).tolist(),
            (src_offsets + src).tolist(),
            record.sizes.tolist(),
            strict=True,
        ):
            ctypes.memmove(d, s, n)
        return _SUCCEEDED

    def registered_region(self, region_id: int) -> LocalRegion | None:
        """The live local region ``region_id`` (how a peer on the fabric reaches its bytes)."""
        with self._lock:
            return None if self._closed else self._regions.get(region_id)


if TYPE_CHECKING:

    def _conforms(engine: InMemoryTransferEngine) -> TransferEngine:
        return engine
