"""TransferEngine over NVIDIA NIXL with its UCX backend (CPU DRAM and GPU VRAM).

Environment defaults, applied before NIXL is imported and only where the variable is unset:

* ``UCX_MODULES=^ib`` -- skip UCX's InfiniBand/EFA modules. With system rdma-core installed
  they load a second libnl and every process that created an agent segfaults at exit; they
  are also useless without an RDMA NIC and slow down start-up.
* ``UCX_NET_DEVICES=lo`` -- only for loopback use (``loopback=True`` or ``host`` of
  127.0.0.1/localhost): keeps UCX's TCP lanes on the loopback interface.

Other UCX variables are left alone; ``UCX_TLS=tcp`` forces pure TCP where cross-memory
attach (``process_vm_readv``) is forbidden, e.g. by a container's seccomp policy.

Progress: the agent runs without NIXL's progress thread (it spins a whole core) and without
its listener thread (metadata travels on moriio's control plane). Progress is driven by
:meth:`NixlTransferEngine.poll` and :meth:`NixlTransferEngine.progress`, which also drain
incoming notifications: an engine that is only ever the *target* of transfers must still call
``progress()`` now and then, or connection wire-up with it stalls.

With UCX's CMA transport (same host), ``post`` performs the copy synchronously in the calling
thread and the batch is usually complete when ``post`` returns: do not post large batches from
a latency-critical event loop.

UCX pays per operation (with CMA one syscall per descriptor), so ``post`` merges descriptors
that are contiguous on both sides before handing the batch to NIXL.
"""

from __future__ import annotations

import collections
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from moriio.adapters.nixl._loader import NixlApi, load_nixl
from moriio.adapters.nixl.descriptor import NixlRegionDescriptor
from moriio.log import get_logger
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
from moriio.ports.batch import Int64s, check_batch

if TYPE_CHECKING:
    from moriio.ports import TransferEngine
    from moriio.ports.transfer_engine import Offsets

_log = get_logger(__name__)

_MEM_TYPES = {MemoryKind.HOST: "DRAM", MemoryKind.DEVICE: "VRAM"}
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_IN_PROGRESS = TransferStatus(TransferState.IN_PROGRESS)
_SUCCEEDED = TransferStatus(TransferState.SUCCEEDED)


@dataclass(slots=True)
class _Local:
    region: LocalRegion
    reg_descs: Any  # nixlRegDList returned by register_memory
    nixl_device: int  # NIXL's device id: the GPU for VRAM, 0 for DRAM


@dataclass(frozen=True, slots=True)
class _Remote:
    region: RemoteRegion
    addr: int
    device_id: int
    mem_type: str


@dataclass(slots=True)
class _Xfer:
    peer: PeerId
    tag: str
    handle: Any | None  # nixl_xfer_handle while NIXL holds resources for it
    status: TransferStatus | None  # set once terminal (or failed by remove_peer)


def _descriptors(base: int, offsets: Int64s, sizes: Int64s, device_id: int) -> npt.NDArray[Any]:
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


class NixlTransferEngine:
    """One NIXL agent (UCX backend) behind the :class:`~moriio.ports.TransferEngine` port.

    ``notify=True`` sends each post's tag as NIXL notification to the target, where
    :meth:`pop_notifications` returns it; by default the tag is local bookkeeping only.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        host: str | None = None,
        loopback: bool = False,
        notify: bool = False,
        backends: Sequence[str] = ("UCX",),
        max_notifications: int = 4096,
    ) -> None:
        self._loopback = loopback or host in _LOOPBACK_HOSTS
        self._api: NixlApi = load_nixl(self._loopback)
        self._name = name or f"moriio-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        config = self._api.agent_config(
            enable_prog_thread=False, enable_listen_thread=False, backends=list(backends)
        )
        creation_errors: tuple[type[Exception], ...] = (RuntimeError, *self._api.errors)
        try:
            self._agent: Any = self._api.agent(self._name, config)
        except creation_errors as exc:
            raise TransferEngineError(f"cannot create NIXL agent {self._name!r}: {exc}") from exc
        if not self._agent.backends:
            raise TransferEngineError(f"NIXL agent {self._name!r} has none of {list(backends)}")
        self._notify = notify
        self._lock = threading.RLock()
        self._regions: dict[int, _Local] = {}
        self._peers: set[PeerId] = set()
        self._peer_by_metadata: dict[bytes, PeerId] = {}
        self._imported: dict[tuple[PeerId, int], _Remote] = {}
        self._xfers: dict[TransferHandle, _Xfer] = {}
        self._unreleased: list[Any] = []  # NIXL handles whose release failed; retried later
        self._notifications: collections.deque[tuple[str, bytes]] = collections.deque(
            maxlen=max_notifications
        )
        self._next_region = 1
        self._next_handle = 1
        self._closed = False

    # -- TransferEngine ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def loopback(self) -> bool:
        return self._loopback

    def metadata(self) -> bytes:
        with self._lock:
            self._check_open()
            return bytes(self._agent.get_agent_metadata())

    def register_region(
        self, addr: int, length: int, kind: MemoryKind = MemoryKind.HOST, device_id: int = 0
    ) -> LocalRegion:
        if addr <= 0 or length <= 0:
            raise ValueError(f"cannot register addr={addr} length={length}: both must be > 0")
        mem_type = _MEM_TYPES[kind]
        nixl_device = device_id if kind is MemoryKind.DEVICE else 0
        with self._lock:
            self._check_open()
            try:
                reg = self._agent.register_memory([(addr, length, nixl_device, "")], mem_type)
                partial = self._agent.get_partial_agent_metadata(reg, inc_conn_info=False)
            except self._api.errors as exc:
                raise TransferEngineError(
                    f"NIXL cannot register {length} bytes of {mem_type} at {addr:#x}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            region_id = self._next_region
            self._next_region += 1
            descriptor = NixlRegionDescriptor(
                self._name, region_id, addr, length, nixl_device, kind, bytes(partial)
            ).encode()
            region = LocalRegion(region_id, addr, length, kind, device_id, descriptor)
            self._regions[region_id] = _Local(region, reg, nixl_device)
            return region

    def deregister_region(self, region: LocalRegion) -> None:
        with self._lock:
            self._check_open()
            local = self._regions.get(region.region_id)
            if local is None or local.region != region:
                raise TransferEngineError(f"region {region.region_id} is not registered here")
            del self._regions[region.region_id]
            self._agent.deregister_memory(local.reg_descs)

    def add_peer(self, metadata: bytes) -> PeerId:
        with self._lock:
            self._check_open()
            known = self._peer_by_metadata.get(metadata)
            if known is not None:
                return known
            try:
                raw_name = self._agent.add_remote_agent(metadata)
            except self._api.errors as exc:
                raise TransferEngineError(f"cannot load NIXL peer metadata: {exc}") from exc
            peer = PeerId(raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name))
            self._peers.add(peer)
            self._peer_by_metadata[metadata] = peer
            return peer

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        desc = NixlRegionDescriptor.decode(descriptor)
        with self._lock:
            self._check_open()
            if peer not in self._peers:
                raise TransferEngineError(f"unknown peer {peer!r}: call add_peer first")
            if desc.agent != peer:
                raise TransferEngineError(
                    f"descriptor belongs to agent {desc.agent!r}, not to peer {peer!r}"
                )
            if desc.agent_metadata:
                try:
                    self._agent.add_remote_agent(desc.agent_metadata)
                except self._api.errors as exc:
                    raise TransferEngineError(
                        f"cannot load region {desc.region_id} metadata of {peer!r}: {exc}"
                    ) from exc
            remote = RemoteRegion(peer, desc.region_id, desc.length)
            self._imported[(peer, desc.region_id)] = _Remote(
                remote, desc.addr, desc.device_id, _MEM_TYPES[desc.kind]
            )
            return remote

    def remove_peer(self, peer: PeerId) -> None:
        """Fail in-flight transfers to ``peer``, forget its regions and disconnect from it."""
        with self._lock:
            self._check_open()
            if peer not in self._peers:
                return
            for xfer in self._xfers.values():
                if xfer.peer == peer and xfer.status is None:
                    xfer.status = TransferStatus(TransferState.FAILED, f"peer {peer} was removed")
                    self._drop_handle(xfer)
            for key in [k for k in self._imported if k[0] == peer]:
                del self._imported[key]
            for md in [m for m, p in self._peer_by_metadata.items() if p == peer]:
                del self._peer_by_metadata[md]
            self._peers.discard(peer)
            try:
                self._agent.remove_remote_agent(peer)
            except self._api.errors as exc:
                _log.warning("NIXL could not remove remote agent", peer=peer, error=str(exc))

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
            handle = TransferHandle(self._next_handle)
            self._next_handle += 1
            xfer = _Xfer(remote.peer, tag, None, None)
            self._xfers[handle] = xfer
            if sz.size == 0:
                xfer.status = _SUCCEEDED
                return handle
            lo, ro, sz = coalesce(lo, ro, sz)
            local_descs = _descriptors(local.addr, lo, sz, mine.nixl_device)
            remote_descs = _descriptors(theirs.addr, ro, sz, theirs.device_id)
            agent = self._agent
            try:
                xfer.handle = agent.initialize_xfer(
                    op.name,
                    agent.get_xfer_descs(local_descs, _MEM_TYPES[local.kind]),
                    agent.get_xfer_descs(remote_descs, theirs.mem_type),
                    remote.peer,
                    tag.encode() if self._notify else b"",
                )
                state = agent.transfer(xfer.handle)
            except self._api.errors as exc:
                state = f"{type(exc).__name__}: {exc}"
            self._settle(xfer, state, "posting")
            return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        with self._lock:
            self._check_open()
            xfer = self._xfers.get(handle)
            if xfer is None:
                raise TransferEngineError(f"unknown or released transfer handle {handle}")
            if xfer.status is not None:
                return xfer.status
            self._progress_locked()
            try:
                state = self._agent.check_xfer_state(xfer.handle)
            except self._api.errors as exc:
                state = f"{type(exc).__name__}: {exc}"
            return self._settle(xfer, state, "polling")

    def progress(self) -> None:
        """Drive UCX progress (connection wire-up, notifications) without blocking."""
        with self._lock:
            self._check_open()
            self._progress_locked()

    def release(self, handle: TransferHandle) -> None:
        """Forget ``handle``; releasing an unknown or released handle does nothing."""
        with self._lock:
            xfer = self._xfers.pop(handle, None)
            if xfer is not None and not self._closed:
                self._drop_handle(xfer)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            for xfer in self._xfers.values():
                self._drop_handle(xfer)
            self._xfers.clear()
            self._retry_releases()
            for peer in list(self._peers):
                self.remove_peer(peer)
            for local in self._regions.values():
                try:
                    self._agent.deregister_memory(local.reg_descs)
                except self._api.errors as exc:
                    _log.warning("NIXL could not deregister region", error=str(exc))
            self._regions.clear()
            self._closed = True
            self._agent = None

    # -- NIXL extras -------------------------------------------------------------------------

    def pop_notifications(self) -> list[tuple[str, bytes]]:
        """(sender, tag) pairs received since the last call (only from ``notify=True`` peers)."""
        with self._lock:
            items = list(self._notifications)
            self._notifications.clear()
            return items

    # -- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransferEngineError(f"engine {self._name!r} is closed")

    def _progress_locked(self) -> None:
        try:
            notifs = self._agent.get_new_notifs()
        except self._api.errors as exc:
            _log.warning("NIXL notification progress failed", error=str(exc))
            return
        for sender, messages in notifs.items():
            self._notifications.extend((sender, m) for m in messages)
        if self._unreleased:
            self._retry_releases()

    def _settle(self, xfer: _Xfer, state: str, when: str) -> TransferStatus:
        if state == "PROC":
            return _IN_PROGRESS
        if state == "DONE":
            xfer.status = _SUCCEEDED
        elif state == "ERR":
            xfer.status = TransferStatus(
                TransferState.FAILED, f"NIXL reported ERR while {when} the transfer"
            )
        else:
            xfer.status = TransferStatus(TransferState.FAILED, f"NIXL {when} failed: {state}")
        self._drop_handle(xfer)
        return xfer.status

    def _drop_handle(self, xfer: _Xfer) -> None:
        handle, xfer.handle = xfer.handle, None
        if handle is None:
            return
        try:
            self._agent.release_xfer_handle(handle)
        except self._api.errors:
            self._unreleased.append(handle)  # still active: NIXL refuses to free it yet

    def _retry_releases(self) -> None:
        pending, self._unreleased = self._unreleased, []
        for handle in pending:
            try:
                self._agent.release_xfer_handle(handle)
            except self._api.errors:
                self._unreleased.append(handle)


if TYPE_CHECKING:

    def _conforms(engine: NixlTransferEngine) -> TransferEngine:
        return engine
