"""A TransferEngine that copies device KV between processes on one host with device kernels,
around the transport's engine (NIXL, mori) for everything else.

The transport pays per descriptor (about 6 us each over cuda_ipc on an H200), so scattered
KV blocks move at 2-10 GB/s where the device gathers them at ~300 GB/s. Here each device
region is exported with its IPC handle alongside the transport's descriptor; a peer on the
same host (same boot id) maps it, and a batch between two mapped regions runs as a gather and
a scatter on the copier's stream (:mod:`moriio.vllm_plugin.device_copies`), completed by a
device event. Regions that cannot be mapped (another host, host memory, a driver refusal)
go through the transport, as do peers whose metadata carries no export.

Both ends add a short envelope to the transport's metadata and descriptors; a peer without
it is reached through the transport alone.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

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
from moriio.vllm_plugin.device_copies import DeviceCopier, byte_view
from moriio.vllm_plugin.peer_memory import (
    DriverPeerMemory,
    PeerMemory,
    PeerMemoryError,
    host_identity,
)

if TYPE_CHECKING:
    from moriio.ports.transfer_engine import Allocation, Offsets

log = get_logger("moriio.vllm")

MAGIC = b"moriio-ipc1"
MAX_HEADER_BYTES = 4096
_OWN_HANDLES = 1 << 48  # handles of device copies start here; the transport's stay below


def wrap(header: dict[str, Any], inner: bytes) -> bytes:
    body = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(body)) + body + inner


def unwrap(data: bytes) -> tuple[dict[str, Any], bytes]:
    """The envelope's header and the transport's bytes (an empty header: no envelope)."""
    if not data.startswith(MAGIC):
        return {}, data
    start = len(MAGIC) + 4
    if len(data) < start:
        raise TransferEngineError("truncated same-host envelope")
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    if length > MAX_HEADER_BYTES or len(data) < start + length:
        raise TransferEngineError(f"same-host envelope header of {length} bytes refused")
    try:
        header = json.loads(data[start : start + length])
    except ValueError as exc:
        raise TransferEngineError(f"same-host envelope is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise TransferEngineError("same-host envelope header is not an object")
    return header, data[start + length :]


@dataclass(frozen=True, slots=True)
class _Mapped:
    """A peer region mapped here: its bytes, and the handle to unmap."""

    view: torch.Tensor
    handle: bytes


@dataclass(slots=True)
class _Copy:
    done: Any
    cancelled: bool = False


class SameHostDeviceEngine:
    """:class:`~moriio.ports.TransferEngine` around ``inner`` (see the module docstring)."""

    def __init__(
        self,
        inner: TransferEngine,
        memory: PeerMemory,
        copier: DeviceCopier,
        *,
        host: str = "",
        pid: int | None = None,
    ) -> None:
        """``host``/``pid``: this process's host identity and id (tests give their own)."""
        self._inner = inner
        self._memory = memory
        self._copier = copier
        self._host = host or host_identity()
        self._pid = os.getpid() if pid is None else pid
        self._lock = threading.Lock()
        self._local: dict[int, tuple[LocalRegion, torch.Tensor | None]] = {}
        self._peers: dict[PeerId, dict[str, Any]] = {}
        self._mapped: dict[tuple[PeerId, int], _Mapped] = {}
        self._copies: dict[TransferHandle, _Copy] = {}
        self._handles = itertools.count(_OWN_HANDLES)
        self.mapped_batches = 0

    @property
    def name(self) -> str:
        return self._inner.name

    def metadata(self) -> bytes:
        return wrap({"host": self._host, "pid": self._pid}, self._inner.metadata())

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
        if kind is MemoryKind.DEVICE:
            try:
                export = self._memory.export(addr)
                header = {"handle": export.handle.hex(), "offset": export.offset, "len": length}
                view = byte_view(addr, length, self._copier.device)
            except (PeerMemoryError, OSError) as exc:
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
        if header.get("handle") and peer_header.get("host") == self._host:
            self._map(peer, remote, header, peer_header.get("pid"))
        return remote

    def _map(self, peer: PeerId, remote: RemoteRegion, header: dict[str, Any], pid: Any) -> None:
        try:
            handle = bytes.fromhex(str(header["handle"]))
            offset, length = int(header["offset"]), int(header["len"])
            if offset < 0 or length != remote.length:
                raise ValueError(f"export of {length} bytes at {offset} for a {remote.length}")
            if pid == self._pid:
                raise ValueError("the peer is this process: its memory is not mapped again")
            base = self._memory.open(handle)
        except (KeyError, ValueError, PeerMemoryError) as exc:
            log.info("same-host peer region reached through the transport", reason=str(exc))
            return
        view = byte_view(base + offset, length, self._copier.device)
        with self._lock:
            self._mapped[(peer, remote.region_id)] = _Mapped(view, handle)

    def remove_peer(self, peer: PeerId) -> None:
        with self._lock:
            gone = [key for key in self._mapped if key[0] == peer]
            mapped = [self._mapped.pop(key) for key in gone]
            self._peers.pop(peer, None)
        self._unmap(mapped)
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
        handle = TransferHandle(next(self._handles))
        with self._lock:
            self._copies[handle] = _Copy(done)
            self.mapped_batches += 1
        return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        copy = self._copies.get(handle)
        if copy is None:
            return self._inner.poll(handle)
        if not copy.done.query():
            return TransferStatus(TransferState.IN_PROGRESS)
        return TransferStatus(TransferState.SUCCEEDED)

    def progress(self) -> None:
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
        self._unmap(mapped)

    def _unmap(self, mapped: list[_Mapped]) -> None:
        """Unmap peer regions once no queued copy can still use them."""
        if mapped and self._copier.device.type != "cpu":
            torch.cuda.synchronize(self._copier.device)
        for region in mapped:
            self._memory.close(region.handle)


def same_host_wrapper(device: torch.device) -> Callable[[TransferEngine], TransferEngine]:
    """What wraps the transport's engine of a worker whose KV is on ``device``."""

    def wrapper(inner: TransferEngine) -> TransferEngine:
        memory = DriverPeerMemory(hip=torch.version.hip is not None)
        return SameHostDeviceEngine(inner, memory, DeviceCopier(device))

    return wrapper
