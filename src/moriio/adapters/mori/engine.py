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
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from moriio.adapters.mori.connections import Local, Memory, Peer, Remote, SessionKey, SharedKey
from moriio.adapters.mori.lanes import (
    Backend,
    EngineSpec,
    Lane,
    build_engine,
    load_mori,
)
from moriio.adapters.mori.regions import Registry
from moriio.adapters.mori.settings import RdmaTuning, check_advertised_host, resolve_tuning
from moriio.adapters.mori.transfers import Xfer
from moriio.adapters.mori.views import VIEW_IDS
from moriio.log import get_logger
from moriio.ports import (
    LocalRegion,
    PeerId,
    RemoteRegion,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)
from moriio.ports.batch import check_batch

if TYPE_CHECKING:
    from moriio.ports import TransferEngine
    from moriio.ports.transfer_engine import Offsets

__all__ = ["MoriTransferEngine", "load_mori"]

_log = get_logger(__name__)
_SUCCEEDED = TransferStatus(TransferState.SUCCEEDED)
_IN_PROGRESS = TransferStatus(TransferState.IN_PROGRESS)


class MoriTransferEngine(Registry):
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
        self._spec = EngineSpec(host, backend, configured, xgmi_num_streams, xgmi_num_events)
        self._tuning = resolve_tuning(self._key, configured) if backend == "rdma" else None
        self._clock = clock
        self._lanes = {0: Lane(0, self._key, build_engine(io, self._key, self._spec, port))}
        self.backend: Backend = backend
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._lane_lock = threading.Lock()
        self._regions: dict[int, Local] = {}
        self._memories: dict[int, Memory] = {}  # live mori registrations by memory id
        self._shared: dict[SharedKey, Memory] = {}  # allocations regions are views of
        self._mem_of: dict[int, int] = {}  # region id -> memory id
        self._next_view = VIEW_IDS
        self._doomed: dict[int, Memory] = {}  # no region left, waiting for quiet transfers
        self._peers: dict[PeerId, Peer] = {}
        self._generation: dict[PeerId, int] = {}  # lane per peer; survives remove_peer
        self._imported: dict[tuple[PeerId, int], Remote] = {}
        self._remote_mems: dict[tuple[PeerId, int], Any] = {}  # (peer, memory id) -> desc
        self._sessions: dict[SessionKey, Any] = {}
        self._xfers: dict[TransferHandle, Xfer] = {}
        self._orphans: list[Xfer] = []  # released, not yet quiet
        self._retained: list[Any] = []  # failed statuses mori may still write, until close
        self._posting = 0
        self._next_handle = 1
        self._closed = False

    # -- TransferEngine ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._key

    def metadata(self) -> bytes:
        with self._lock:
            self._check_open()
            return bytes(self._lanes[0].engine.get_engine_desc().pack())

    def add_peer(self, metadata: bytes) -> PeerId:
        metadata = bytes(metadata)
        try:
            desc = self._io.EngineDesc.unpack(metadata)
        except Exception as exc:  # the binding raises whatever msgpack raised
            raise ValueError(f"malformed mori engine descriptor: {exc}") from exc
        peer = PeerId(str(desc.key))
        with self._lock:
            self._check_open()
            known = self._peers.get(peer)
            if known is not None and known.metadata == metadata:
                return peer
            if known is not None:  # same key, other endpoint: mori's QPs to it are stale
                self._forget_peer(peer)
                self._generation[peer] = self._generation.get(peer, 0) + 1
            self._peers[peer] = Peer(desc, metadata)
            return peer

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        """Import a peer's region; the first region of a remote memory builds the sessions
        from every local memory to it now (TCP + QP exchange on RDMA), off the post path."""
        region, base, desc = self._read_descriptor(peer, descriptor)
        mem_key = (peer, int(desc.id))
        with self._lock:
            self._check_open()
            if peer not in self._peers:
                raise TransferEngineError(f"unknown peer {peer!r}: call add_peer first")
            if desc.engine_key != peer:
                raise TransferEngineError(
                    f"descriptor belongs to engine {desc.engine_key!r}, not to peer {peer!r}"
                )
            known = self._remote_mems.get(mem_key)
            if known is None or known != desc:
                self._drop_sessions(lambda k: k[2] == peer and k[3] == mem_key[1])
                known = self._remote_mems[mem_key] = desc
            remote = Remote(region, known, base)
            self._imported[(peer, region.region_id)] = remote
            missing = self._missing_sessions(self._generation.get(peer, 0), peer, mem_key[1])
            self._posting += 1
        try:
            for key in missing:
                self._connect(key)
        except TransferEngineError:
            with self._lock:
                if self._imported.get((peer, region.region_id)) is remote:
                    del self._imported[(peer, region.region_id)]
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
            self._check_open()
            if peer not in self._peers:
                return
            for xfer in self._xfers.values():
                if xfer.peer == peer:
                    xfer.finish(
                        TransferStatus(
                            TransferState.FAILED,
                            f"peer {peer} was removed; mori cannot cancel, so bytes already "
                            "posted may still land until the engine reports the peer quiet",
                        )
                    )
            self._forget_peer(peer)

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
            mine = self._regions.get(local.region_id)
            if mine is None or mine.region != local:
                raise TransferEngineError(f"local region {local.region_id} is not registered")
            theirs = self._imported.get((remote.peer, remote.region_id))
            if theirs is None or theirs.region != remote:
                raise TransferEngineError(
                    f"remote region {remote.region_id} of peer {remote.peer!r} is not imported"
                )
            lo, ro, sz = check_batch(
                local_offsets, remote_offsets, sizes, local.length, remote.length
            )
            lo, ro = (
                (lo + mine.base if mine.base else lo),
                (ro + theirs.base if theirs.base else ro),
            )
            now = self._clock()
            self._reap(now)
            handle = TransferHandle(self._next_handle)
            self._next_handle += 1
            lane = self._generation.get(remote.peer, 0)
            single = self._tuning is None or self._tuning.single_chain(int(sz.size))
            mem_id, remote_mem = mine.memory.mem_id, int(theirs.desc.id)
            xfer = Xfer(remote.peer, lane, local.region_id, mem_id, single)
            self._xfers[handle] = xfer
            refusal = self._refusal(remote.peer, lane, now) if sz.size else ""
            if refusal or not sz.size:
                xfer.posting, xfer.quiet_at = False, now
                xfer.finish(
                    TransferStatus(TransferState.FAILED, refusal) if refusal else _SUCCEEDED
                )
                return handle
            key = (lane, mem_id, remote.peer, remote_mem)
            session = self._sessions.get(key)
            self._posting += 1
        status, error = None, ""
        try:
            if session is None:
                session = self._connect(key)
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
            self._settle_post(xfer, status, error, self._clock())
            self._idle.notify_all()
        return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        with self._lock:
            self._check_open()
            xfer = self._xfers.get(handle)
            if xfer is None:
                raise TransferEngineError(f"unknown or released transfer handle {handle}")
            self._observe(xfer, self._clock())
            return _IN_PROGRESS if xfer.final is None else xfer.final

    def progress(self) -> None:
        """mori completes transfers on its own threads; this forgets what became quiet and
        hands deregistered regions back to mori once nothing can land in them."""
        with self._lock:
            self._check_open()
            self._reap(self._clock())

    def cancel(self, handle: TransferHandle) -> None:
        """mori cannot cancel: the batch runs until its queue pair completes or gives up."""
        with self._lock:
            self._check_open()
            if handle not in self._xfers:
                raise TransferEngineError(f"unknown or released transfer handle {handle}")

    def settled(self, handle: TransferHandle) -> bool:
        """Quiet: mori reported the batch done, or failed so that its queue pairs stopped."""
        with self._lock:
            self._check_open()
            xfer = self._xfers.get(handle)
            if xfer is None:
                raise TransferEngineError(f"unknown or released transfer handle {handle}")
            return self._quiet(xfer, self._clock())

    def release(self, handle: TransferHandle) -> None:
        """Forget ``handle``; releasing an unknown or released handle does nothing."""
        with self._lock:
            xfer = self._xfers.pop(handle, None)
            if xfer is not None and not self._quiet(xfer, self._clock()):
                self._orphans.append(xfer)

    def close(self) -> None:
        """Destroy the mori engines: their queue pairs go, so no byte lands after this."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._posting:
                self._idle.wait()
            self._sessions.clear()
            self._xfers.clear()
            self._orphans.clear()
            lanes, self._lanes = self._lanes, {}
            lanes.clear()  # the last references: mori's engines are destroyed here
            self._retained.clear()
            self._regions.clear()
            self._memories.clear()
            self._shared.clear()
            self._mem_of.clear()
            self._doomed.clear()
            self._peers.clear()
            self._imported.clear()
            self._remote_mems.clear()

    # -- beyond the port ---------------------------------------------------------------------

    def quiet(self, region: LocalRegion | None = None, peer: PeerId | None = None) -> bool:
        """True when no byte of any transfer (released or not, failed or not) that uses
        ``region`` and/or goes to ``peer`` can land any more; both None: every transfer."""
        with self._lock:
            now = self._clock()
            self._reap(now)
            for xfer in self._all_xfers():
                if region is not None and xfer.local_id != region.region_id:
                    continue
                if peer is not None and xfer.peer != peer:
                    continue
                if not self._quiet(xfer, now):
                    return False
            return region is None or self._mem_of.get(region.region_id) not in self._doomed


if TYPE_CHECKING:

    def _conforms(engine: MoriTransferEngine) -> TransferEngine:
        return engine
