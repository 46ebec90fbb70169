"""A TransferEngine that copies device KV between processes on one host with device kernels,
around the transport's engine (NIXL, mori) for everything else.

The transport pays per descriptor (about 6 us each over cuda_ipc on an H200), so scattered
KV blocks move at 2-10 GB/s where the device copies them at hundreds. Here each device
region is exported with its IPC handle alongside the transport's descriptor; a peer on the
same host (same boot id) maps it, and a batch between two mapped regions runs as one kernel
launch on the copier's stream (:mod:`moriio.adapters.device.copier`), completed by a
device event. Regions that cannot be mapped (another host, host memory, a driver refusal)
go through the transport, as do peers whose metadata carries no export.

Both ends add a short envelope (:mod:`moriio.adapters.device.envelope`) to the transport's
metadata and descriptors; a peer without it is reached through the transport alone, and an
engine that shares nothing (``share=False``) still reads the envelopes of peers that do.

Removing a peer never waits on the device: its mappings are closed once the copies queued
before the removal have run (checked, without blocking, on every call that drives the
engine); :meth:`SameHostDeviceEngine.close` (shutdown) waits for them at most ``unmap_wait`` s,
then leaves them open rather than unmap memory a copy may still use.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from moriio.adapters.device.copier import Completion, DeviceCopier
from moriio.adapters.device.envelope import ProcessIdentity, unwrap, wrap
from moriio.adapters.device.peer_memory import (
    DriverPeerMemory,
    PeerMemory,
    PeerMemoryError,
    byte_view,
)
from moriio.log import get_logger
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

if TYPE_CHECKING:
    from moriio.ports.transfer_engine import Allocation, Offsets

log = get_logger("moriio.device")

_OWN_HANDLES = 1 << 48  # handles of device copies start here; the transport's stay below
UNMAP_WAIT = 10.0  # seconds close() waits for queued copies before leaving mappings open


@dataclass(frozen=True, slots=True)
class _Mapped:
    """A peer region mapped here: its bytes, and the handle to unmap."""

    view: torch.Tensor
    handle: bytes


@dataclass(slots=True)
class _Copy:
    done: Completion
    tag: str
    cancelled: bool = False


@dataclass(slots=True)
class _Retiring:
    """Mappings of a removed peer, closed once the copies queued before it have run."""

    mapped: list[_Mapped]
    after: Completion


class SameHostDeviceEngine:
    """:class:`~moriio.ports.TransferEngine` around ``inner`` (see the module docstring)."""

    def __init__(
        self,
        inner: TransferEngine,
        memory: PeerMemory,
        copier: DeviceCopier,
        *,
        identity: ProcessIdentity | None = None,
        share: bool = True,
        unmap_wait: float = UNMAP_WAIT,
    ) -> None:
        """``identity``: this process's (tests give their own); ``share`` False: export
        nothing and map nothing, only read peers' envelopes."""
        self._inner = inner
        self._memory = memory
        self._copier = copier
        self._me = identity or ProcessIdentity.of_this_process()
        self._share = share
        self._unmap_wait = unmap_wait
        self._lock = threading.Lock()
        self._local: dict[int, tuple[LocalRegion, torch.Tensor | None]] = {}
        self._peers: dict[PeerId, dict[str, Any]] = {}
        self._mapped: dict[tuple[PeerId, int], _Mapped] = {}
        self._retiring: list[_Retiring] = []
        self._copies: dict[TransferHandle, _Copy] = {}
        self._handles = itertools.count(_OWN_HANDLES)
        self.mapped_batches = 0

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def copier(self) -> DeviceCopier:
        return self._copier

    def metadata(self) -> bytes:
        return wrap(self._me.header(), self._inner.metadata())

    def register_region(
        self,
        addr: int,
        length: int,
        kind: MemoryKind = MemoryKind.HOST,
        device_id: int = 0,
        allocation: Allocation | None = None,
    ) -> LocalRegion:
        inner = self._inner.register_region(addr, length, kind, device_id, allocation)
        header: dict[str, Any] = {}
        view = None
        if kind is MemoryKind.DEVICE and self._share:
            try:
                export = self._memory.export(addr)
                view = byte_view(addr, length, self._copier.device)
                header = {"handle": export.handle.hex(), "offset": export.offset, "len": length}
            except (PeerMemoryError, OSError, RuntimeError) as exc:
                log.warning("device KV not shared with same-host peers", reason=str(exc))
        region = LocalRegion(
            inner.region_id, addr, length, kind, device_id, wrap(header, inner.descriptor)
        )
        with self._lock:
            self._local[region.region_id] = (inner, view)
        return region

    def deregister_region(self, region: LocalRegion) -> None:
        with self._lock:
            entry = self._local.pop(region.region_id, None)
        if entry is None:
            raise TransferEngineError(f"region {region.region_id} is not registered here")
        self._inner.deregister_region(entry[0])

    def add_peer(self, metadata: bytes) -> PeerId:
        header, inner = unwrap(metadata)
        peer = self._inner.add_peer(inner)
        with self._lock:
            self._peers[peer] = header
        return peer

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        header, inner = unwrap(descriptor)
        remote = self._inner.import_region(peer, inner)
        peer_header = self._peers.get(peer, {})
        if self._share and header.get("handle") and self._me.same_host(peer_header):
            self._map(peer, remote, header, peer_header)
        return remote

    def _map(
        self, peer: PeerId, remote: RemoteRegion, header: dict[str, Any], peer_header: Any
    ) -> None:
        try:
            handle = bytes.fromhex(str(header["handle"]))
            offset, length = int(header["offset"]), int(header["len"])
            if offset < 0 or length != remote.length:
                raise ValueError(f"export of {length} bytes at {offset} for a {remote.length}")
            if self._me.is_me(peer_header):
                raise ValueError("the peer is this process: its memory is not mapped again")
            base = self._memory.open(handle)
        except (KeyError, ValueError, PeerMemoryError) as exc:
            log.info("same-host peer region reached through the transport", reason=str(exc))
            return
        try:
            view = byte_view(base + offset, length, self._copier.device)
        except (PeerMemoryError, RuntimeError) as exc:
            self._memory.close(handle)
            log.warning("same-host peer region reached through the transport", reason=str(exc))
            return
        with self._lock:
            self._mapped[(peer, remote.region_id)] = _Mapped(view, handle)

    def remove_peer(self, peer: PeerId) -> None:
        with self._lock:
            gone = [key for key in self._mapped if key[0] == peer]
            mapped = [self._mapped.pop(key) for key in gone]
            self._peers.pop(peer, None)
        self._retire(mapped)
        self._inner.remove_peer(peer)

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
        self._unmap_retired()
        with self._lock:
            entry = self._local.get(local.region_id)
            mapped = self._mapped.get((remote.peer, remote.region_id))
        if entry is None:
            raise TransferEngineError(f"region {local.region_id} is not registered here")
        inner_local, view = entry
        if mapped is None or view is None:
            return self._inner.post(
                op, inner_local, remote, local_offsets, remote_offsets, sizes, tag
            )
        local_offsets, remote_offsets, sizes = check_batch(
            local_offsets, remote_offsets, sizes, local.length, remote.length
        )
        if op is TransferOp.READ:
            done = self._copier.copy(view, mapped.view, local_offsets, remote_offsets, sizes)
        else:
            done = self._copier.copy(mapped.view, view, remote_offsets, local_offsets, sizes)
        if done.error:
            log.warning("device copy failed", tag=tag, reason=done.error)
        handle = TransferHandle(next(self._handles))
        with self._lock:
            self._copies[handle] = _Copy(done, tag)
            self.mapped_batches += 1
        return handle

    def after_copies(self, tags: frozenset[str], queue: Callable[[int], None]) -> bool:
        """Run ``queue`` (stream memory operations) on the device right after the copies of
        every batch tagged ``tags``, when each of them is a copy of this engine still known
        and not failed; those copies then complete only after it. False: nothing queued."""
        with self._lock:
            copies = [c for c in self._copies.values() if c.tag in tags and not c.done.error]
            if not tags or {c.tag for c in copies} != tags:
                return False
            after = self._copier.after_copies(queue)
            for copy in copies:
                copy.done = after
        return True

    def poll(self, handle: TransferHandle) -> TransferStatus:
        copy = self._copies.get(handle)
        if copy is None:
            return self._inner.poll(handle)
        if copy.done.error:
            return TransferStatus(TransferState.FAILED, copy.done.error)
        if not copy.done.query():
            return TransferStatus(TransferState.IN_PROGRESS)
        return TransferStatus(TransferState.SUCCEEDED)

    def progress(self) -> None:
        self._unmap_retired()
        self._inner.progress()

    def cancel(self, handle: TransferHandle) -> None:
        copy = self._copies.get(handle)
        if copy is None:
            self._inner.cancel(handle)
        else:
            copy.cancelled = True  # queued kernels run to the end: the bytes still land

    def settled(self, handle: TransferHandle) -> bool:
        copy = self._copies.get(handle)
        return self._inner.settled(handle) if copy is None else bool(copy.done.query())

    def release(self, handle: TransferHandle) -> None:
        with self._lock:
            copy = self._copies.pop(handle, None)
        if copy is None:
            self._inner.release(handle)

    def close(self) -> None:
        with self._lock:
            mapped = list(self._mapped.values())
            self._mapped.clear()
        self._retire(mapped)
        deadline = time.monotonic() + self._unmap_wait
        while self._retiring and time.monotonic() < deadline:
            self._unmap_retired()
            if self._retiring:
                time.sleep(0.001)
        if self._retiring:
            log.warning(
                "same-host mappings left open: copies queued before them never completed",
                mappings=sum(len(r.mapped) for r in self._retiring),
                waited=self._unmap_wait,
            )

    def _retire(self, mapped: list[_Mapped]) -> None:
        """Unmap ``mapped`` once the copies queued so far have run (never waits here)."""
        if not mapped:
            return
        try:
            after = self._copier.stream.marker()
        except RuntimeError as exc:  # the device is gone: nothing queued will run again
            log.warning("unmapping after a device error", reason=str(exc))
            after = None
        with self._lock:
            if after is None:
                self._retiring.append(_Retiring(mapped, _Ran()))
            else:
                self._retiring.append(_Retiring(mapped, after))
        self._unmap_retired()

    def _unmap_retired(self) -> None:
        if not self._retiring:
            return
        with self._lock:
            ready = [r for r in self._retiring if r.after.query()]
            self._retiring = [r for r in self._retiring if r not in ready]
        for retired in ready:
            for region in retired.mapped:
                self._memory.close(region.handle)


@dataclass(slots=True)
class _Ran:
    error: str = ""

    def query(self) -> bool:
        return True


def same_host_wrapper(
    device: torch.device, *, share: bool = True, gates: object = None
) -> Callable[[TransferEngine], TransferEngine]:
    """What wraps the transport's engine of a worker whose KV is on ``device`` (``share``
    False: the envelopes of same-host peers are read, nothing is mapped). ``gates``: the
    worker's layer gates (:class:`~moriio.adapters.device.stream_gates.StreamGates`), which
    the engine's copies may then open on the device."""

    def wrapper(inner: TransferEngine) -> TransferEngine:
        memory = DriverPeerMemory(hip=torch.version.hip is not None) if share else _NoMemory()
        engine = SameHostDeviceEngine(inner, memory, DeviceCopier(device), share=share)
        attach = getattr(gates, "attach", None)
        if share and attach is not None:
            attach(engine)
        return engine

    return wrapper


class _NoMemory:
    """PeerMemory of an engine that shares nothing."""

    def export(self, address: int) -> Any:
        raise PeerMemoryError("same-host copies are off")

    def open(self, handle: bytes) -> int:
        raise PeerMemoryError("same-host copies are off")

    def close(self, handle: bytes) -> None:
        return None
