"""TransferEngine over AMD's mori IO engine (``mori.io``): RDMA, or XGMI between local GPUs.

Targets amd-mori 1.2.2 and later; peer-failure events and queue-pair liveness need 1.2.4 (both
are looked up, and skipped where mori lacks them). The engine key (``name``) is the given name
plus a per-instance suffix, so a restarted process never meets its predecessor's queue pairs in
a peer; ``get_engine_desc().pack()`` is the metadata, ``MemoryDesc.pack()`` the region
descriptor. Regions registered inside one ``allocation`` (vLLM's shared KV buffer) are views of
one mori registration (see :mod:`moriio.adapters.mori.regions`). One ``IOEngineSession`` per
(lane, local memory, remote memory) is cached; each post is one ``batch_read``/``batch_write``.
Notifications are off: completion travels on moriio's control plane.

Threading: mori's set-up calls hold the interpreter lock, so sessions (and the lanes and
registrations they need) are built on the adapter's own connection thread
(:mod:`~moriio.adapters.mori.connector`): ``import_region`` asks for them and returns, and a
batch posted before its session exists waits (IN_PROGRESS, nothing posted). mori calls that may
block (a post waits up to ``MORI_IO_SQ_BACKOFF_TIMEOUT_US`` on a full send queue) run outside
the adapter lock. Every mori exception becomes a TransferEngineError or a FAILED status.

Faults: endpoints mori reports broken or retired by a fatal NIC event, a session it reports
dead (``IOEngineSession.alive()``) or a peer failure it reports (``pop_peer_failure()``,
drained by :meth:`MoriTransferEngine.progress`) move the peer to a new lane: fresh queue pairs,
without a restart of either side. Failed is not stopped (mori cannot cancel):
:meth:`MoriTransferEngine.quiet` tells when nothing can land any more, and regions go back to
mori only then.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from moriio.adapters.mori.completions import Completions
from moriio.adapters.mori.connections import Connections, SessionKey
from moriio.adapters.mori.connector import Connector
from moriio.adapters.mori.faults import retire_unused_lanes, session_alive, take_peer_failures
from moriio.adapters.mori.lanes import Backend, EngineSpec, Lanes, load_mori
from moriio.adapters.mori.nics import NicFamily, host_family
from moriio.adapters.mori.peers import Peer, PeerTable, check_engine_desc, read_region_descriptor
from moriio.adapters.mori.regions import LocalRegions
from moriio.adapters.mori.settings import check_advertised_host, configured_tuning, resolve_tuning
from moriio.adapters.mori.transfers import Batch, Xfer
from moriio.adapters.mori.waiting import Waiting
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
from moriio.ports.batch import check_registration
from moriio.ports.post_checks import check_held_post, check_import

if TYPE_CHECKING:
    from moriio.ports import TransferEngine
    from moriio.ports.transfer_engine import Offsets

__all__ = ["MoriTransferEngine", "load_mori"]

_SUCCEEDED = TransferStatus(TransferState.SUCCEEDED)


class MoriTransferEngine:
    """mori ``IOEngine``s with one backend, behind the TransferEngine port.

    ``backend="rdma"`` (default) creates an RDMA backend; the advertised ``host`` must then be
    an IPv4 literal. Send-queue settings left None are chosen for ``nic_family`` (None: this
    host's NICs; see :mod:`~moriio.adapters.mori.nics`). ``backend="xgmi"`` creates an XGMI
    backend (intra-node AMD GPU memory only). ``clock`` (seconds) is only for tests.
    """

    def __init__(
        self,
        key: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        backend: Backend = "rdma",
        qp_per_transfer: int | None = None,
        post_batch_size: int = -1,
        num_worker_threads: int | None = None,
        max_send_wr: int | None = None,
        transfer_chunking: bool | None = None,
        nic_family: NicFamily | None = None,
        poll_cq_event_mode: bool = False,
        xgmi_num_streams: int = 64,
        xgmi_num_events: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if backend not in ("rdma", "xgmi"):
            raise ValueError(f"backend must be 'rdma' or 'xgmi', got {backend!r}")
        if backend == "rdma":
            check_advertised_host(host)
        configured = configured_tuning(
            host_family() if nic_family is None else nic_family,
            qp_per_transfer=qp_per_transfer,
            post_batch_size=post_batch_size,
            num_worker_threads=num_worker_threads,
            max_send_wr=max_send_wr,
            transfer_chunking=transfer_chunking,
            poll_cq_event_mode=poll_cq_event_mode,
        )
        self._io = io = load_mori()
        self._key = f"{key}@{uuid.uuid4().hex[:12]}"
        spec = EngineSpec(host, backend, configured, xgmi_num_streams, xgmi_num_events)
        self._tuning = resolve_tuning(self._key, configured) if backend == "rdma" else None
        self._clock = clock
        self.backend: Backend = backend
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._lanes = Lanes(io, self._key, spec, port, self._lock)
        self._local = LocalRegions(self._lanes)
        self._peers = PeerTable()
        self._connections = Connections(self._lock, self._lanes, self._local, self._peers, clock)
        self._completions = Completions(self._tuning, self._connections.connection_lost)
        self._connector = Connector(self._build, self._key)
        weakref.finalize(self, self._connector.close)  # dropped without close(): end its thread
        self._waiting, self._posting = Waiting(), 0  # _posting: mori calls outside the lock

    # -- TransferEngine ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._key

    def metadata(self) -> bytes:
        with self._lock:
            self._lanes.check_open()
            return bytes(self._lanes.first.engine.get_engine_desc().pack())

    def register_region(
        self,
        addr: int,
        length: int,
        kind: MemoryKind = MemoryKind.HOST,
        device_id: int = 0,
        allocation: Allocation | None = None,
    ) -> LocalRegion:
        """Register a region; inside ``allocation``, a view of it (registered once)."""
        check_registration(addr, length, allocation)
        with self._lock:
            self._lanes.check_open()
            return self._local.register(addr, length, kind, device_id, allocation)

    def deregister_region(self, region: LocalRegion) -> None:
        """Refuse new posts on ``region`` now; once its memory holds no region any more, hand
        that memory back to mori when its work is quiet."""
        with self._lock:
            self._lanes.check_open()
            emptied = self._local.deregister(region)
            if emptied is not None:
                self._connections.forget_local_memory(emptied.mem_id)
            self._reap(self._clock())

    def add_peer(self, metadata: bytes) -> PeerId:
        metadata = bytes(metadata)
        try:
            desc = self._io.EngineDesc.unpack(metadata)
        except Exception as exc:  # the binding raises whatever msgpack raised
            raise ValueError(f"malformed mori engine descriptor: {exc}") from exc
        peer = check_engine_desc(desc, rdma=self.backend == "rdma")
        with self._lock:
            self._lanes.check_open()
            known = self._peers.get(peer)
            if known is not None and known.metadata == metadata:
                return peer
            if known is not None:  # same key, other endpoint: mori's QPs to it are stale
                self._connections.forget_peer(peer)
                self._peers.next_lane(peer, self._peers.lane(peer))
            self._peers.add(peer, Peer(desc, metadata))
            return peer

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        """Import a peer's region; the first region of a remote memory asks the connection
        thread for the sessions from every local memory to it (TCP + QP exchange on RDMA)."""
        region, base, desc = read_region_descriptor(self._io, peer, descriptor)
        remote_mem = int(desc.id)
        with self._lock:
            self._lanes.check_open()
            check_import(peer, peer in self._peers, desc.engine_key)
            remote, changed = self._peers.record_import(region, desc, base)
            if changed:
                self._connections.forget_remote_memory(peer, remote_mem)
            self._connector.request(
                self._connections.missing(self._peers.lane(peer), peer, remote_mem)
            )
        return remote.region

    def remove_peer(self, peer: PeerId) -> None:
        """Fail in-flight transfers to ``peer`` and forget it (mori keeps moving their bytes
        until :meth:`quiet` says otherwise)."""
        with self._lock:
            self._lanes.check_open()
            if peer not in self._peers:
                return
            why = f"peer {peer} was removed; mori cannot cancel, so bytes already posted may "
            why += "still land until the engine reports the peer quiet"
            self._completions.fail_peer(peer, TransferStatus(TransferState.FAILED, why))
            self._waiting.drop(lambda k: k[2] == peer, self._clock())
            self._connector.forget(lambda k: k[2] == peer)
            self._connections.forget_peer(peer)

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
        """One ``batch_read``/``batch_write`` once its session exists; refusals that posted
        nothing are BACKPRESSURE (see :mod:`~moriio.adapters.mori.completions`)."""
        with self._lock:
            self._lanes.check_open()
            registered, imported = self._local.get(local.region_id), self._peers.imported(remote)
            mine, theirs, lo, ro, sz = check_held_post(
                local, registered, remote, imported, local_offsets, remote_offsets, sizes
            )
            lo, ro = (
                (lo + mine.base if mine.base else lo),
                (ro + theirs.base if theirs.base else ro),
            )
            now = self._clock()
            self._reap(now)
            lane = self._peers.lane(remote.peer)
            mem_id, remote_mem = mine.memory.mem_id, int(theirs.desc.id)
            xfer = Xfer(
                remote.peer, lane, local.region_id, mem_id, local.kind, Batch(op, lo, ro, sz)
            )
            handle = self._completions.add(xfer)
            refusal = self._peers.refusal(remote.peer, now) if sz.size else ""
            if refusal or not sz.size:
                xfer.quiet_at = now
                xfer.finish(
                    TransferStatus(TransferState.FAILED, refusal) if refusal else _SUCCEEDED
                )
                return handle
            key: SessionKey = (lane, mem_id, remote.peer, remote_mem)
            session = self._connections.session(key)
            if session is not None and not session_alive(session):
                self._connections.connection_lost(
                    remote.peer, lane, "mori reports the connection's queue pairs dead"
                )
                xfer.lane = self._peers.lane(remote.peer)
                key, session = (xfer.lane, mem_id, remote.peer, remote_mem), None
            if session is None:
                self._waiting.add(key, xfer)
                self._connector.request([key])
                return handle
            xfer.posting = True
            self._posting += 1
        self._post(xfer, session)
        return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        with self._lock:
            self._lanes.check_open()
            return self._completions.status(handle, self._clock())

    def progress(self) -> None:
        """Take the peer failures mori reported (each moves its peer to a new connection),
        forget what became quiet and hand deregistered regions back to mori once nothing can
        land in them. mori completes transfers on its own threads."""
        with self._lock:
            self._lanes.check_open()
            take_peer_failures(self._lanes, self._peers, self._completions, self._connections)
            self._reap(self._clock())

    def cancel(self, handle: TransferHandle) -> None:
        """mori cannot cancel: the batch runs until its queue pair completes or gives up. A
        batch still waiting for its connection is dropped (nothing of it was posted)."""
        with self._lock:
            self._lanes.check_open()
            xfer = self._completions.get(handle)
            if xfer.waiting:
                self._waiting.cancel(xfer, self._clock())

    def settled(self, handle: TransferHandle) -> bool:
        """Quiet: mori reported the batch done, or failed so that its queue pairs stopped."""
        with self._lock:
            self._lanes.check_open()
            return self._completions.settled(handle, self._clock())

    def release(self, handle: TransferHandle) -> None:
        """Forget ``handle``; releasing an unknown or released handle does nothing."""
        with self._lock:
            self._completions.release(handle, self._clock())

    def close(self) -> None:
        """Destroy the mori engines: their queue pairs go, so no byte lands after this."""
        with self._lock:
            if self._lanes.closed:
                return
            self._lanes.closed = True
            self._connector.close()
            self._waiting.drop(lambda _: True, self._clock())
            while self._posting:
                self._idle.wait()
            self._connections.clear()
            self._lanes.destroy()  # the last references: mori's engines are destroyed here
            self._completions.clear()  # mori wrote its statuses until now
            self._local.clear()
            self._peers.clear()

    # -- beyond the port ---------------------------------------------------------------------

    def quiet(self, region: LocalRegion | None = None, peer: PeerId | None = None) -> bool:
        """True when no byte of any transfer (released or not, failed or not) that uses
        ``region`` and/or goes to ``peer`` can land any more; both None: every transfer."""
        with self._lock:
            now = self._clock()
            self._reap(now)
            region_id = None if region is None else region.region_id
            if not self._completions.quiet(now, region_id, peer):
                return False
            return region is None or not self._local.is_doomed(region)

    def wait_for_connections(self, timeout: float) -> bool:
        """Block until the connection thread has nothing to build; False on timeout."""
        return self._connector.wait_idle(timeout)

    def _post(self, xfer: Xfer, session: Any) -> None:
        """One mori post, outside the adapter lock (``xfer.posting`` is set)."""
        batch, status, error = xfer.batch, None, ""
        try:
            xfer.uid = int(session.allocate_transfer_uid())
            call = session.batch_read if batch.op is TransferOp.READ else session.batch_write
            status = call(
                batch.local_offsets.tolist(),
                batch.remote_offsets.tolist(),
                batch.sizes.tolist(),
                xfer.uid,
            )
        except (RuntimeError, TypeError, ValueError) as exc:
            error = f"mori refused the post: {type(exc).__name__}: {exc}"
        with self._lock:
            self._posting -= 1
            self._completions.settle_post(xfer, status, error, self._clock())
            self._idle.notify_all()

    def _build(self, key: SessionKey) -> None:
        """Build the session ``key`` names, then post what waits for it (connection thread)."""
        with self._lock:
            if self._lanes.closed:
                return
            self._posting += 1
        session, error = None, ""
        try:
            session = self._connections.connect(key)
        except TransferEngineError as exc:
            error = str(exc)
        if session is None and not error:
            error = (
                f"mori has no {self.backend} route from local memory {key[1]} to memory "
                f"{key[3]} of {key[2]!r} (create_session returned None)"
            )
        with self._lock:
            self._posting -= 1
            now = self._clock()
            ready, moved = self._waiting.settle(key, error, self._peers, now)
            for xfer in ready:
                xfer.posting = True
                self._posting += 1
            self._connector.request(moved)
            self._idle.notify_all()
        for xfer in ready:
            self._post(xfer, session)

    def _reap(self, now: float) -> None:
        """Forget quiet released batches; hand back to mori each deregistered memory nothing
        can land in any more; destroy lanes no peer uses any more."""
        self._completions.forget_quiet_orphans(now)
        if self._local.has_doomed:
            self._local.release_doomed(self._completions.busy_memories(now))
        if len(self._lanes.indices) > 1:  # only lanes above 0 are ever destroyed
            busy = self._completions.posting_lanes()
            busy |= {k[0] for k in self._connector.pending()} | self._waiting.lanes()
            parts = (self._lanes, self._peers, self._completions, self._connections)
            retire_unused_lanes(*parts, busy, now)


if TYPE_CHECKING:

    def _conforms(engine: MoriTransferEngine) -> TransferEngine:
        return engine
