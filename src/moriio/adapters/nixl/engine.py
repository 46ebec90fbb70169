"""TransferEngine over NVIDIA NIXL with its UCX backend (CPU DRAM and GPU VRAM).

UCX environment defaults: see :mod:`moriio.adapters.nixl._loader`.

Cancel and teardown: freeing an active NIXL handle is NIXL's abort, but with UCX it may
report success while the bytes keep landing; invalidating a remote agent does not stop
requests already posted either, and makes NIXL report ERR for them while they still move
bytes. So ``cancel`` leaves a batch running, a batch is settled (no byte of it can land any
more) once NIXL reports it DONE or ERR, and ``remove_peer`` refuses new work at once but
invalidates the agent only once none of its transfers is in progress.

Progress: the agent runs without NIXL's progress thread (it spins a whole core) and without
its listener thread (metadata travels on moriio's control plane). Progress is driven by
:meth:`NixlTransferEngine.poll` and :meth:`NixlTransferEngine.progress`, which also drain
incoming notifications: an engine that is only ever the *target* of transfers must still call
``progress()`` now and then, or connection wire-up with it stalls.

With UCX's CMA transport (same host), ``post`` performs the copy synchronously in the calling
thread and the batch is usually complete when ``post`` returns: do not post large batches from
a latency-critical event loop.

UCX pays per operation (with CMA one syscall per descriptor), so ``post`` sorts a batch by
remote address and merges descriptors contiguous on both sides before handing it to NIXL.
Regions inside one allocation (vLLM's KV buffer) share one NIXL registration of it
(:mod:`moriio.adapters.nixl.regions`).

A failure NIXL misnames carries its likely cause: see :mod:`moriio.adapters.nixl.failures`.
"""

from __future__ import annotations

import collections
import os
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from moriio.adapters.nixl._loader import NixlApi, load_nixl
from moriio.adapters.nixl.batches import (
    IN_PROGRESS,
    MEM_TYPES,
    SUCCEEDED,
    Remote,
    Xfer,
    submit,
    touches_device,
    verdict,
)
from moriio.adapters.nixl.descriptor import NixlRegionDescriptor
from moriio.adapters.nixl.regions import LocalRegions
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
from moriio.ports.batch import check_registration
from moriio.ports.post_checks import check_held_post, check_import, known_batch

if TYPE_CHECKING:
    from moriio.ports.transfer_engine import Allocation, Offsets, TransferEngine

_log = get_logger(__name__)

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


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
        self._regions = LocalRegions(self._agent, self._api.errors, self._name)
        self._peers: set[PeerId] = set()
        self._peer_by_metadata: dict[bytes, PeerId] = {}
        self._imported: dict[tuple[PeerId, int], Remote] = {}
        self._xfers: dict[TransferHandle, Xfer] = {}
        self._unreleased: list[Xfer] = []  # batches whose NIXL handle is still active
        self._removing: set[PeerId] = set()  # removed; invalidated once their work ended
        self._device_ok: set[tuple[PeerId, str]] = set()  # (peer, op) device batches that worked
        self._notifications: collections.deque[tuple[str, bytes]] = collections.deque(
            maxlen=max_notifications
        )
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
        self,
        addr: int,
        length: int,
        kind: MemoryKind = MemoryKind.HOST,
        device_id: int = 0,
        allocation: Allocation | None = None,
    ) -> LocalRegion:
        """Register a region; inside ``allocation``, a view of it (registered with NIXL
        once: see :mod:`moriio.adapters.nixl.regions`)."""
        check_registration(addr, length, allocation)
        with self._lock:
            self._check_open()
            return self._regions.register(addr, length, kind, device_id, allocation)

    def deregister_region(self, region: LocalRegion) -> None:
        with self._lock:
            self._check_open()
            self._regions.deregister(region)

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
            self._removing.discard(peer)  # back before its removal finished: keep it loaded
            self._peers.add(peer)
            self._peer_by_metadata[metadata] = peer
            return peer

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        desc = NixlRegionDescriptor.decode(descriptor)
        with self._lock:
            self._check_open()
            check_import(peer, peer in self._peers, desc.agent, "agent")
            if desc.agent_metadata:
                try:
                    self._agent.add_remote_agent(desc.agent_metadata)
                except self._api.errors as exc:
                    raise TransferEngineError(
                        f"cannot load region {desc.region_id} metadata of {peer!r}: {exc}"
                    ) from exc
            remote = RemoteRegion(peer, desc.region_id, desc.length)
            self._imported[(peer, desc.region_id)] = Remote(
                remote, desc.addr, desc.device_id, MEM_TYPES[desc.kind]
            )
            return remote

    def remove_peer(self, peer: PeerId) -> None:
        """Fail in-flight transfers to ``peer`` and forget its regions; disconnect from it
        once none of them is in progress any more (see the module docstring)."""
        with self._lock:
            self._check_open()
            if peer not in self._peers:
                return
            for xfer in self._xfers.values():  # failed, but polled on until they ended
                if xfer.peer == peer and xfer.status is None:
                    xfer.status = TransferStatus(TransferState.FAILED, f"peer {peer} was removed")
            for key in [k for k in self._imported if k[0] == peer]:
                del self._imported[key]
            for md in [m for m, p in self._peer_by_metadata.items() if p == peer]:
                del self._peer_by_metadata[md]
            self._peers.discard(peer)
            self._removing.add(peer)
            self._finish_removals()

    def _finish_removals(self) -> None:
        """Invalidate removed agents none of whose transfers is in progress any more."""
        for peer in list(self._removing):
            live = [x for x in self._xfers.values() if x.peer == peer and not x.settled]
            for xfer in live:
                if xfer.handle is not None:
                    self._settle(xfer, "polling")
            if any(not x.settled for x in live):
                continue
            self._removing.discard(peer)
            try:
                self._agent.remove_remote_agent(peer)  # invalidateRemoteMD: disconnects
            except self._api.errors as exc:
                _log.error("NIXL could not remove remote agent", peer=peer, error=str(exc))

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
            mine, theirs, lo, ro, sz = check_held_post(
                local,
                self._regions.get(local.region_id),
                remote,
                self._imported.get((remote.peer, remote.region_id)),
                local_offsets,
                remote_offsets,
                sizes,
            )
            handle, self._next_handle = TransferHandle(self._next_handle), self._next_handle + 1
            xfer = Xfer(remote.peer, tag, None, None, touches_device(mine, theirs), op=op.name)
            self._xfers[handle] = xfer
            if sz.size == 0:
                xfer.status, xfer.settled = SUCCEEDED, True
                return handle
            batch, notif = (lo, ro, sz), (tag.encode() if self._notify else b"")
            state = submit(self._agent, self._api.errors, xfer, op, mine, theirs, batch, notif)
            self._settle(xfer, "posting", state)
            return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        with self._lock:
            self._check_open()
            xfer = known_batch(self._xfers, handle)
            if not xfer.settled and xfer.handle is not None:
                self._progress_locked()  # may have settled it (a removal finishing)
            if xfer.settled or xfer.handle is None:
                return xfer.status or IN_PROGRESS
            return self._settle(xfer, "polling")

    def progress(self) -> None:
        """Drive UCX progress (connection wire-up, notifications) without blocking."""
        with self._lock:
            self._check_open()
            self._progress_locked()

    def cancel(self, handle: TransferHandle) -> None:
        """Leave the batch running: NIXL's abort (freeing an active handle) may report success
        while UCX keeps moving the bytes, so the handle is kept and polled until it ends."""
        with self._lock:
            self._check_open()
            known_batch(self._xfers, handle)

    def settled(self, handle: TransferHandle) -> bool:
        with self._lock:
            self._check_open()
            xfer = known_batch(self._xfers, handle)
            if not xfer.settled and xfer.handle is not None:
                self._progress_locked()
            if not xfer.settled and xfer.handle is not None:
                self._settle(xfer, "polling")
            return xfer.settled

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
                self.remove_peer(peer)  # nothing in flight is tracked: invalidated at once
            self._regions.close()
            self._closed = True
            self._agent = None

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
        if self._removing:
            self._finish_removals()

    def _settle(self, xfer: Xfer, when: str, state: str | None = None) -> TransferStatus:
        """Record NIXL's state (asked if not given); not PROC: the work ended, settled."""
        if state is None:
            try:
                state = str(self._agent.check_xfer_state(xfer.handle))
            except self._api.errors as exc:
                state = f"{type(exc).__name__}: {exc}"
        proven = (xfer.peer, xfer.op) in self._device_ok
        status = verdict(state, when, xfer.device, proven)
        if status is None:
            return xfer.status or IN_PROGRESS
        if status is SUCCEEDED and xfer.device:
            self._device_ok.add((xfer.peer, xfer.op))
        xfer.status, xfer.settled = xfer.status or status, True
        self._drop_handle(xfer)
        return xfer.status

    def _drop_handle(self, xfer: Xfer) -> bool:
        """Free the NIXL handle of a batch that ended; False while NIXL refuses."""
        if xfer.handle is None:
            return True
        try:
            self._agent.release_xfer_handle(xfer.handle)
        except self._api.errors:
            if xfer not in self._unreleased:
                self._unreleased.append(xfer)  # still active: NIXL refuses to free it yet
            return False
        xfer.handle = None
        return True

    def _retry_releases(self) -> None:
        self._unreleased = [x for x in self._unreleased if not self._drop_handle(x)]


if TYPE_CHECKING:

    def _conforms(engine: NixlTransferEngine) -> TransferEngine:
        return engine
