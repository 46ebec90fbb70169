"""TransferEngine over AMD's mori IO engine (``mori.io``): RDMA, or XGMI between local GPUs.

Mapping: the engine key is the peer id; ``get_engine_desc().pack()`` is the metadata and
``MemoryDesc.pack()`` the region descriptor. One ``IOEngineSession`` per (local region,
remote region) pair is created on first use, cached, and dropped with the peer or region.
Each post is one ``session.batch_read``/``batch_write`` with a uid from
``allocate_transfer_uid()``. Notifications are disabled (``enable_notification=False``):
completion travels on moriio's control plane. mori is imported when the engine is built.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from moriio.adapters.mori.status import MoriStatusCode, classify_status
from moriio.ports import (
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
from moriio.ports.batch import check_batch

if TYPE_CHECKING:
    from moriio.ports import TransferEngine
    from moriio.ports.transfer_engine import Offsets

Backend = Literal["rdma", "xgmi"]
_SessionKey = tuple[int, PeerId, int]  # (local region, peer, remote region)
_PENDING_CODES = (int(MoriStatusCode.INIT), int(MoriStatusCode.IN_PROGRESS))
_SUCCEEDED = TransferStatus(TransferState.SUCCEEDED)


def load_mori() -> Any:
    """Import ``mori.io``; ImportError with the reason when mori cannot be loaded here."""
    try:
        importlib.import_module("mori.cpp")
        return importlib.import_module("mori.io")
    except (ImportError, OSError) as exc:
        raise ImportError(
            "mori IO is not importable here "
            f"({type(exc).__name__}: {exc}); it needs the amd-mori package, a ROCm runtime "
            "and an RDMA NIC or AMD GPUs"
        ) from exc


@dataclass(frozen=True, slots=True)
class _Local:
    region: LocalRegion
    desc: Any  # mori MemoryDesc


@dataclass(frozen=True, slots=True)
class _Remote:
    region: RemoteRegion
    desc: Any  # mori MemoryDesc


@dataclass(frozen=True, slots=True)
class _Peer:
    desc: Any  # mori EngineDesc
    metadata: bytes


@dataclass(slots=True)
class _Xfer:
    peer: PeerId
    status: Any | None  # mori TransferStatus while it may still change
    final: TransferStatus | None  # set once terminal or backpressured


class MoriTransferEngine:
    """One mori ``IOEngine`` with one backend, behind the TransferEngine port.

    ``backend="rdma"`` (default) creates an RDMA backend from the given tuning values;
    ``backend="xgmi"`` an XGMI backend (intra-node AMD GPU memory only).
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
    ) -> None:
        if backend not in ("rdma", "xgmi"):
            raise ValueError(f"backend must be 'rdma' or 'xgmi', got {backend!r}")
        io = load_mori()
        self._io = io
        self._key = key
        self._engine = io.IOEngine(key=key, config=io.IOEngineConfig(host=host, port=port))
        if backend == "rdma":
            mode = io.PollCqMode.EVENT if poll_cq_event_mode else io.PollCqMode.POLLING
            config = io.RdmaBackendConfig(
                qp_per_transfer=qp_per_transfer,
                post_batch_size=post_batch_size,
                num_worker_threads=num_worker_threads,
                poll_cq_mode=mode,
                enable_notification=False,
            )
            self._engine.create_backend(io.BackendType.RDMA, config)
        else:
            config = io.XgmiBackendConfig(num_streams=xgmi_num_streams, num_events=xgmi_num_events)
            self._engine.create_backend(io.BackendType.XGMI, config)
        self.backend: Backend = backend
        self._lock = threading.RLock()
        self._regions: dict[int, _Local] = {}
        self._peers: dict[PeerId, _Peer] = {}
        self._imported: dict[tuple[PeerId, int], _Remote] = {}
        self._sessions: dict[_SessionKey, Any] = {}
        self._xfers: dict[TransferHandle, _Xfer] = {}
        self._draining: list[Any] = []  # released statuses mori may still write to
        self._next_handle = 1
        self._closed = False

    # -- TransferEngine ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._key

    def metadata(self) -> bytes:
        with self._lock:
            self._check_open()
            return bytes(self._engine.get_engine_desc().pack())

    def register_region(
        self, addr: int, length: int, kind: MemoryKind = MemoryKind.HOST, device_id: int = 0
    ) -> LocalRegion:
        if addr <= 0 or length <= 0:
            raise ValueError(f"cannot register addr={addr} length={length}: both must be > 0")
        loc = self._io.MemoryLocationType
        with self._lock:
            self._check_open()
            try:
                desc = self._engine.register_memory(
                    ptr=addr,
                    size=length,
                    device_id=-1 if kind is MemoryKind.HOST else device_id,
                    mem_loc=loc.CPU if kind is MemoryKind.HOST else loc.GPU,
                )
            except RuntimeError as exc:
                raise TransferEngineError(
                    f"mori cannot register {length} bytes at {addr:#x}: {exc}"
                ) from exc
            region = LocalRegion(int(desc.id), addr, length, kind, device_id, bytes(desc.pack()))
            self._regions[region.region_id] = _Local(region, desc)
            return region

    def deregister_region(self, region: LocalRegion) -> None:
        with self._lock:
            self._check_open()
            local = self._regions.get(region.region_id)
            if local is None or local.region != region:
                raise TransferEngineError(f"region {region.region_id} is not registered here")
            del self._regions[region.region_id]
            self._drop_sessions(lambda k: k[0] == region.region_id)
            self._engine.deregister_memory(local.desc)

    def add_peer(self, metadata: bytes) -> PeerId:
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
            if known is not None:  # same key, new incarnation
                self.remove_peer(peer)
            try:
                self._engine.register_remote_engine(desc)
            except RuntimeError as exc:
                raise TransferEngineError(f"mori cannot register engine {peer!r}: {exc}") from exc
            self._peers[peer] = _Peer(desc, bytes(metadata))
            return peer

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        try:
            desc = self._io.MemoryDesc.unpack(descriptor)
        except Exception as exc:
            raise ValueError(f"malformed mori memory descriptor: {exc}") from exc
        with self._lock:
            self._check_open()
            if peer not in self._peers:
                raise TransferEngineError(f"unknown peer {peer!r}: call add_peer first")
            if desc.engine_key != peer:
                raise TransferEngineError(
                    f"descriptor belongs to engine {desc.engine_key!r}, not to peer {peer!r}"
                )
            remote = RemoteRegion(peer, int(desc.id), int(desc.size))
            self._drop_sessions(lambda k: k[1] == peer and k[2] == remote.region_id)
            self._imported[(peer, remote.region_id)] = _Remote(remote, desc)
            return remote

    def remove_peer(self, peer: PeerId) -> None:
        """Fail in-flight transfers to ``peer``, drop its sessions and deregister it."""
        with self._lock:
            self._check_open()
            known = self._peers.pop(peer, None)
            if known is None:
                return
            for xfer in self._xfers.values():
                if xfer.peer == peer and xfer.final is None:
                    xfer.final = TransferStatus(TransferState.FAILED, f"peer {peer} was removed")
                    self._retire(xfer)
            self._drop_sessions(lambda k: k[1] == peer)
            for key in [k for k in self._imported if k[0] == peer]:
                del self._imported[key]
            self._engine.deregister_remote_engine(known.desc)

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
            self._purge_draining()
            handle = TransferHandle(self._next_handle)
            self._next_handle += 1
            xfer = _Xfer(remote.peer, None, None)
            self._xfers[handle] = xfer
            if sz.size == 0:
                xfer.final = _SUCCEEDED
                return handle
            session = self._session(mine, theirs)
            if session is None:
                xfer.final = TransferStatus(
                    TransferState.FAILED,
                    f"mori has no {self.backend} route from local region {local.region_id} to "
                    f"region {remote.region_id} of {remote.peer!r} (create_session returned None)",
                )
                return handle
            uid = self._engine.allocate_transfer_uid()
            batch = session.batch_read if op is TransferOp.READ else session.batch_write
            try:
                xfer.status = batch(lo.tolist(), ro.tolist(), sz.tolist(), uid)
            except RuntimeError as exc:
                xfer.final = TransferStatus(TransferState.FAILED, f"mori refused the post: {exc}")
            return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        with self._lock:
            self._check_open()
            xfer = self._xfers.get(handle)
            if xfer is None:
                raise TransferEngineError(f"unknown or released transfer handle {handle}")
            if xfer.final is not None:
                return xfer.final
            status = xfer.status
            assert status is not None  # a post without final state always holds a status
            code = int(status.Code())
            message = "" if code in _PENDING_CODES else str(status.Message())
            result = classify_status(code, message)
            if result.state is not TransferState.IN_PROGRESS:
                xfer.final, xfer.status = result, None
            return result

    def progress(self) -> None:
        """mori's backend completes transfers on its own; forget released statuses it finished."""
        with self._lock:
            self._check_open()
            self._purge_draining()

    def release(self, handle: TransferHandle) -> None:
        """Forget ``handle``; releasing an unknown or released handle does nothing."""
        with self._lock:
            xfer = self._xfers.pop(handle, None)
            if xfer is not None:
                self._retire(xfer)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            for xfer in self._xfers.values():
                self._retire(xfer)
            self._xfers.clear()
            for peer in list(self._peers):
                self.remove_peer(peer)
            for local in self._regions.values():
                self._engine.deregister_memory(local.desc)
            self._regions.clear()
            self._closed = True

    # -- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransferEngineError(f"engine {self._key!r} is closed")

    def _session(self, local: _Local, remote: _Remote) -> Any | None:
        key = (local.region.region_id, remote.region.peer, remote.region.region_id)
        session = self._sessions.get(key)
        if session is None:
            session = self._engine.create_session(local.desc, remote.desc)
            if session is not None:
                self._sessions[key] = session
        return session

    def _drop_sessions(self, doomed: Callable[[_SessionKey], bool]) -> None:
        for key in [k for k in self._sessions if doomed(k)]:
            del self._sessions[key]

    def _retire(self, xfer: _Xfer) -> None:
        """Keep a status mori may still update alive until it leaves the pending codes."""
        status, xfer.status = xfer.status, None
        if status is not None and int(status.Code()) in _PENDING_CODES:
            self._draining.append(status)

    def _purge_draining(self) -> None:
        if self._draining:
            self._draining = [s for s in self._draining if int(s.Code()) in _PENDING_CODES]


if TYPE_CHECKING:

    def _conforms(engine: MoriTransferEngine) -> TransferEngine:
        return engine
