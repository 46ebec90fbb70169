"""TransferEngine over AMD's mori IO engine (``mori.io``): RDMA, or XGMI between local GPUs.

Targets mori v1.1.0 and later. Mapping: the engine key (``name``) is the given name plus a
per-instance suffix, so a restarted process never meets its predecessor's queue pairs in a
peer; ``get_engine_desc().pack()`` is the metadata and ``MemoryDesc.pack()`` the region
descriptor. Regions registered inside one ``allocation`` (vLLM's shared KV buffer) are views
of one mori registration: each post shifts its offsets by the view's place in it, and a peer
imports each allocation once (see :mod:`moriio.adapters.mori.regions`). One
``IOEngineSession`` per (lane, local memory, remote memory) is cached; each post is one
``session.batch_read``/``batch_write``. Notifications are disabled: completion travels on
moriio's control plane.

Threading: mori calls that can block (``create_session`` connects over TCP; a post waits up to
``MORI_IO_SQ_BACKOFF_TIMEOUT_US`` on a full send queue) run outside the adapter lock, so
``poll``/``release``/``progress`` on other threads never wait for them. Sessions are built in
``import_region`` (handshake time) from every local memory to the imported one, so the
forward path finds them built; a post only builds one after memory was registered after the
handshake or a broken connection moved to a new lane. Every mori exception becomes a
TransferEngineError or a FAILED status carrying the cause.

Failed is not stopped: mori cannot cancel. A batch failed by ``remove_peer`` may still move
bytes; :meth:`MoriTransferEngine.quiet` tells when nothing can land any more. Regions are
handed back to mori only once their transfers are quiet (early deregistration would turn the
in-flight work into error completions that break the queue pair for everyone).

Parts: :class:`~moriio.adapters.mori.lanes.Lanes` (the mori engines),
:class:`~moriio.adapters.mori.regions.LocalRegions` (registrations),
:class:`~moriio.adapters.mori.peers.PeerTable` (peers and imports),
:class:`~moriio.adapters.mori.connections.Connections` (sessions) and
:class:`~moriio.adapters.mori.completions.Completions` (posted batches), all under one lock.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from moriio.adapters.mori.completions import Completions
from moriio.adapters.mori.connections import Connections
from moriio.adapters.mori.lanes import Backend, EngineSpec, Lanes, load_mori
from moriio.adapters.mori.peers import Peer, PeerTable, read_region_descriptor
from moriio.adapters.mori.regions import LocalRegions
from moriio.adapters.mori.settings import RdmaTuning, check_advertised_host, resolve_tuning
from moriio.adapters.mori.transfers import Xfer
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

    ``backend="rdma"`` (default) creates an RDMA backend from the given tuning values; the
    advertised ``host`` must then be an IPv4 literal. ``backend="xgmi"`` creates an XGMI
    backend (intra-node AMD GPU memory only). ``clock`` (seconds) is only for tests.
    """

    def __init__(
        self,
        key: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        backend: Backend = "rdma",
        qp_per_transfer: int = 1,
        post_batch_size: int = -1,
        num_worker_threads: int = -1,
        poll_cq_event_mode: bool = False,
        xgmi_num_streams: int = 64,
        xgmi_num_events: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if backend not in ("rdma", "xgmi"):
            raise ValueError(f"backend must be 'rdma' or 'xgmi', got {backend!r}")
        if backend == "rdma":
            check_advertised_host(host)
        configured = RdmaTuning(
            qp_per_transfer=qp_per_transfer,
            post_batch_size=post_batch_size,
            num_worker_threads=num_worker_threads,
            poll_cq_event_mode=poll_cq_event_mode,
        )
        io = load_mori()
        self._io = io
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
        self._completions = Completions(self._connections.connection_lost)
        self._posting = 0  # mori calls running outside the lock

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
        peer = PeerId(str(desc.key))
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
        """Import a peer's region; the first region of a remote memory builds the sessions
        from every local memory to it now (TCP + QP exchange on RDMA), off the post path."""
        region, base, desc = read_region_descriptor(self._io, peer, descriptor)
        remote_mem = int(desc.id)
        with self._lock:
            self._lanes.check_open()
            check_import(peer, peer in self._peers, desc.engine_key)
            remote, changed = self._peers.record_import(region, desc, base)
            if changed:
                self._connections.forget_remote_memory(peer, remote_mem)
            missing = self._connections.missing(self._peers.lane(peer), peer, remote_mem)
            self._posting += 1
        try:
            for key in missing:
                self._connections.connect(key)
        except TransferEngineError:
            with self._lock:
                self._peers.unimport(remote)
            raise
        finally:
            with self._lock:
                self._posting -= 1
                self._idle.notify_all()
        return remote.region

    def remove_peer(self, peer: PeerId) -> None:
        """Fail in-flight transfers to ``peer`` and forget it (mori keeps moving their bytes
        until :meth:`quiet` says otherwise)."""
        with self._lock:
            self._lanes.check_open()
            if peer not in self._peers:
                return
            self._completions.fail_peer(
                peer,
                TransferStatus(
                    TransferState.FAILED,
                    f"peer {peer} was removed; mori cannot cancel, so bytes already "
                    "posted may still land until the engine reports the peer quiet",
                ),
            )
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
        """Post one ``batch_read``/``batch_write``; mori's "SQ full" shows as BACKPRESSURE
        in :meth:`poll` when nothing of the batch was posted (see
        :mod:`~moriio.adapters.mori.completions`)."""
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
            single = self._tuning is None or self._tuning.single_chain(int(sz.size))
            mem_id, remote_mem = mine.memory.mem_id, int(theirs.desc.id)
            xfer = Xfer(remote.peer, lane, local.region_id, mem_id, single)
            handle = self._completions.add(xfer)
            refusal = self._peers.refusal(remote.peer, lane, now) if sz.size else ""
            if refusal or not sz.size:
                xfer.posting, xfer.quiet_at = False, now
                xfer.finish(
                    TransferStatus(TransferState.FAILED, refusal) if refusal else _SUCCEEDED
                )
                return handle
            key = (lane, mem_id, remote.peer, remote_mem)
            session = self._connections.session(key)
            self._posting += 1
        status, error = None, ""
        try:
            if session is None:
                session = self._connections.connect(key)
            if session is None:
                error = (
                    f"mori has no {self.backend} route from local memory {mem_id} to memory "
                    f"{remote_mem} of {remote.peer!r} (create_session returned None)"
                )
            else:
                batch = session.batch_read if op is TransferOp.READ else session.batch_write
                status = batch(
                    lo.tolist(), ro.tolist(), sz.tolist(), session.allocate_transfer_uid()
                )
        except TransferEngineError as exc:
            error = str(exc)
        except (RuntimeError, TypeError, ValueError) as exc:
            error = f"mori refused the post: {type(exc).__name__}: {exc}"
        with self._lock:
            self._posting -= 1
            self._completions.settle_post(xfer, status, error, self._clock())
            self._idle.notify_all()
        return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        with self._lock:
            self._lanes.check_open()
            return self._completions.status(handle, self._clock())

    def progress(self) -> None:
        """mori completes transfers on its own threads; this forgets what became quiet and
        hands deregistered regions back to mori once nothing can land in them."""
        with self._lock:
            self._lanes.check_open()
            self._reap(self._clock())

    def cancel(self, handle: TransferHandle) -> None:
        """mori cannot cancel: the batch runs until its queue pair completes or gives up."""
        with self._lock:
            self._lanes.check_open()
            self._completions.check_known(handle)

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

    def _reap(self, now: float) -> None:
        """Forget quiet released batches; hand back to mori each deregistered memory nothing
        can land in any more."""
        self._completions.forget_quiet_orphans(now)
        if self._local.has_doomed:
            self._local.release_doomed(self._completions.busy_memories(now))


if TYPE_CHECKING:

    def _conforms(engine: MoriTransferEngine) -> TransferEngine:
        return engine
