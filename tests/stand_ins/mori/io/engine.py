"""Stand-in for ``mori.io.engine``: ``IOEngine`` and ``IOEngineSession`` (amd-mori 1.2.4).

Reproduces what mori does, as read from its source (``src/io/engine.cpp``,
``src/io/rdma/*``, ``src/pybind/pybind_io.cpp``) and the 1.2.4 wheel, and really copies bytes
between CPU memory:

* The set-up calls (the constructor, ``create_backend``, ``register_memory``,
  ``create_session``) hold the interpreter lock for ``stand_in.SETUP_GIL_SECONDS`` each, as
  their bindings do; posts and ``allocate_transfer_uid`` release it.
* RDMA ``create_backend`` fails without an active NIC; ``MORI_IO_*`` variables override the
  config as mori parses them (:mod:`mori.io.env`). ``register_memory`` only records the
  descriptor; ids start at 0 per engine.
* ``create_session`` builds missing QPs by dialling the registered host:port (it raises
  ``RuntimeError`` when nothing answers) and caches the remote region's key by (engine key,
  region id); posting, completions and faults: :mod:`mori.io.rdma`.
* XGMI (same node, GPU memory on both sides) dials nothing: the peer's memory is mapped
  through its IPC handle. Copies complete when ``Code()`` polls their events; a copy that
  cannot reach the peer's memory fails with ``ERR_GPU_OP``, a missing route with
  ``ERR_BAD_STATE``.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any

from mori import stand_in
from mori.cpp import (
    BackendType,
    EngineDesc,
    IOEngineConfig,
    MemoryDesc,
    MemoryLocationType,
    PeerFailureEvent,
    RdmaBackendConfig,
    StatusCode,
    TransferStatus,
    XgmiBackendConfig,
)
from mori.io.env import effective_config
from mori.io.gil import setup_call
from mori.io.rdma import RdmaBackend

_PORTS = itertools.count(47000)
_UIDS_LOCK = threading.Lock()


class IOEngineSession:
    """Pre-resolved (local, remote) pair over a fixed set of QPs; positional arguments only."""

    def __init__(
        self,
        engine: IOEngine,
        local: MemoryDesc,
        remote: MemoryDesc,
        endpoints: list[Any],
        remote_mr: tuple[int, int],
        route: BackendType,
    ) -> None:
        self._engine = engine
        self._local = local
        self._remote = remote
        self._endpoints = endpoints
        self._remote_mr = remote_mr
        self._route = route

    def allocate_transfer_uid(self) -> int:
        return self._engine.allocate_transfer_uid()

    def read(self, *args: int) -> TransferStatus:
        lo, ro, size, uid = args
        return self._engine._submit("read", self, [lo], [ro], [size], uid)

    def write(self, *args: int) -> TransferStatus:
        lo, ro, size, uid = args
        return self._engine._submit("write", self, [lo], [ro], [size], uid)

    def batch_read(self, *args: Any) -> TransferStatus:
        lo, ro, sizes, uid = args
        return self._engine._submit("read", self, lo, ro, sizes, uid)

    def batch_write(self, *args: Any) -> TransferStatus:
        lo, ro, sizes, uid = args
        return self._engine._submit("write", self, lo, ro, sizes, uid)

    def alive(self) -> bool:
        """1.2.4: whether every QP of the session is alive (XGMI: always)."""
        return all(ep.alive() for ep in self._endpoints)


class IOEngine:
    def __init__(self, key: str, config: IOEngineConfig) -> None:
        setup_call("IOEngine")
        port = config.port or next(_PORTS)
        self._desc = EngineDesc(key, config.host, port)
        self.stand_in = stand_in.Control()
        self._remotes: dict[str, EngineDesc] = {}
        self._memory: dict[int, MemoryDesc] = {}
        self._ids = itertools.count(0)
        self._uids = itertools.count(0)
        self.rdma = RdmaBackend(self, RdmaBackendConfig())  # until create_backend(RDMA)
        stand_in.attach(self, port)

    def get_engine_desc(self) -> EngineDesc:
        return self._desc

    def create_backend(self, type: BackendType, config: Any = None) -> None:
        setup_call("CreateBackend")
        if type not in (BackendType.RDMA, BackendType.XGMI, BackendType.FABRIC):
            raise NotImplementedError("backend not implemented yet")
        if type in self.stand_in.backends:
            return  # mori logs a warning and keeps the first one
        if type is BackendType.RDMA:
            if not stand_in.NIC_ACTIVE:
                raise RuntimeError(
                    "no active RDMA device on this host; "
                    "set MORI_DISABLE_AUTO_XGMI=0 to enable XGMI-only fallback"
                )
            if self._desc.port == 1:
                raise RuntimeError("IOEngineConfig.port=1 is reserved as XGMI-only fallback")
            config = effective_config(config or RdmaBackendConfig())
            self.rdma.stop()
            self.rdma = RdmaBackend(self, config)
            if config.qp_per_transfer == 1 and stand_in.DEVICE.name.startswith("ionic"):
                self.stand_in.warnings.append(
                    "ionic NIC detected with qpPerTransfer=1: single-QP ionic performance is "
                    "prone to SQ full under load; consider increasing qpPerTransfer (e.g. 4) "
                    "and setting numWorkerThreads to the same value"
                )
        elif config is None:
            config = XgmiBackendConfig()
        self.stand_in.backends[type] = config

    def remove_backend(self, type: BackendType) -> None:
        self.stand_in.backends.pop(type, None)

    def register_remote_engine(self, engine_desc: EngineDesc) -> None:
        self._remotes[engine_desc.key] = engine_desc

    def deregister_remote_engine(self, engine_desc: EngineDesc) -> None:
        self._remotes.pop(engine_desc.key, None)  # QPs and remote keys stay

    def register_memory(
        self, ptr: int, size: int, device_id: int, mem_loc: MemoryLocationType
    ) -> MemoryDesc:
        setup_call("RegisterMemory")
        desc = MemoryDesc()
        gpu = mem_loc == MemoryLocationType.GPU
        desc._set(
            engine_key=self._desc.key,
            id=next(self._ids),
            device_id=device_id,
            device_bus_id=f"0000:{device_id:02x}:00.0" if gpu else "",
            data=ptr,
            size=size,
            loc=MemoryLocationType(mem_loc),
            numa_node=-1 if gpu else 0,
        )
        self._memory[desc.id] = desc
        self.stand_in.registered.append((ptr, size))
        return desc

    def register_torch_tensor(self, tensor: Any) -> MemoryDesc:
        if not tensor.is_contiguous():
            raise RuntimeError("input tensor must be contiguous")
        index = tensor.device.index
        loc = {"cpu": MemoryLocationType.CPU, "cuda": MemoryLocationType.GPU}[tensor.device.type]
        size = tensor.nelement() * tensor.element_size()
        return self.register_memory(tensor.data_ptr(), size, -1 if index is None else index, loc)

    def deregister_memory(self, mem_desc: MemoryDesc) -> None:
        self._memory.pop(mem_desc.id, None)
        self.stand_in.deregistered.append(mem_desc.id)

    def allocate_transfer_uid(self) -> int:
        with _UIDS_LOCK:
            return next(self._uids)

    def read(self, *args: Any) -> TransferStatus:
        local, lo, remote, ro, size, uid = args
        return self._engine_op("read", local, [lo], remote, [ro], [size], uid)

    def write(self, *args: Any) -> TransferStatus:
        local, lo, remote, ro, size, uid = args
        return self._engine_op("write", local, [lo], remote, [ro], [size], uid)

    def batch_read(self, *args: Any) -> list[TransferStatus]:
        return self._engine_batch("read", *args)

    def batch_write(self, *args: Any) -> list[TransferStatus]:
        return self._engine_batch("write", *args)

    def create_session(self, local_mem: MemoryDesc, remote_mem: MemoryDesc) -> Any:
        setup_call("CreateSession")
        route = self._route(local_mem, remote_mem)
        if route is None:
            return None
        peer = self._remotes.get(remote_mem.engine_key)
        if route is BackendType.XGMI:  # IPC mapping: no control plane involved
            remote_mr = (remote_mem.data, remote_mem.size)
            self.stand_in.sessions_created += 1
            return IOEngineSession(self, local_mem, remote_mem, [], remote_mr, route)
        assert peer is not None
        wanted = self.rdma.config.qp_per_transfer
        endpoints = self.rdma.connect(peer, wanted, self._dial)
        key = (remote_mem.engine_key, remote_mem.id)
        if key not in self.rdma.remote_mrs:  # AskRemoteMemoryRegion
            target = self._dial(peer)
            mine = target._memory.get(remote_mem.id)
            length = 0 if mine is None else mine.size
            if length != remote_mem.size:
                raise RuntimeError(
                    f"RdmaBackend::CreateSession: remote MR size mismatch for engine "
                    f"{remote_mem.engine_key} memId={remote_mem.id} expected={remote_mem.size} "
                    f"got={length}"
                )
            assert mine is not None
            self.rdma.remote_mrs[key] = (mine.data, mine.size)
        self.stand_in.sessions_created += 1
        return IOEngineSession(
            self, local_mem, remote_mem, endpoints, self.rdma.remote_mrs[key], route
        )

    def pop_inbound_transfer_status(self, remote_key: str, transfer_uid: int) -> Any:
        return None  # notifications are the target's; the stand-in's engines never send them

    def pop_peer_failure(self) -> PeerFailureEvent | None:
        """1.2.4: the oldest failure not taken yet; None says only that none was seen."""
        return self.rdma.pop_failure()

    def wait_all(self, statuses: list[TransferStatus], timeout_ms: int = -1) -> StatusCode:
        codes = [s.WaitFor(timeout_ms) for s in statuses]
        failed = [c for c in codes if c > 10]  # Failed(): code > ERR_BEGIN
        if failed:
            return failed[0]
        pending = [c for c in codes if c in (StatusCode.INIT, StatusCode.IN_PROGRESS)]
        return StatusCode.IN_PROGRESS if pending else StatusCode.SUCCESS

    # -- stand-in internals ------------------------------------------------------------------

    def registered_ids(self) -> set[int]:
        return set(self._memory)

    def _dial(self, peer: EngineDesc) -> IOEngine:
        self.stand_in.dials += 1
        target = stand_in.listener(peer.port)
        if target is None:
            raise RuntimeError(f"TCP connect to {peer.host}:{peer.port} failed: Connection refused")
        return target

    def _engine_batch(self, op: str, *args: Any) -> list[TransferStatus]:
        locals_, los, remotes, ros, sizes, uids = args
        assert len(locals_) == len(los) == len(remotes) == len(ros) == len(sizes) == len(uids)
        return [
            self._engine_op(op, *pair)
            for pair in zip(locals_, los, remotes, ros, sizes, uids, strict=True)
        ]

    def _engine_op(
        self,
        op: str,
        local: MemoryDesc,
        lo: list[int],
        remote: MemoryDesc,
        ro: list[int],
        sizes: list[int],
        uid: int,
    ) -> TransferStatus:
        session = self.create_session(local, remote)
        if session is None:
            status = TransferStatus()
            status.Update(
                StatusCode.ERR_BAD_STATE, "No available backend found, create backend first"
            )
            return status
        return self._submit(op, session, lo, ro, sizes, uid)

    def _route(self, local: MemoryDesc, remote: MemoryDesc) -> BackendType | None:
        backends = self.stand_in.backends
        gpu_pair = local.loc == remote.loc == MemoryLocationType.GPU
        peer = self._remotes.get(remote.engine_key)
        same_node = peer is not None and peer.node_id == self._desc.node_id
        if BackendType.XGMI in backends and gpu_pair and same_node and remote.device_bus_id:
            return BackendType.XGMI
        if BackendType.RDMA in backends and peer is not None and peer.port != 1:
            return BackendType.RDMA
        return None

    def _submit(
        self,
        op: str,
        session: IOEngineSession,
        local_offsets: list[int],
        remote_offsets: list[int],
        sizes: list[int],
        uid: int,
    ) -> TransferStatus:
        status = TransferStatus()
        local, remote = session._local, session._remote
        if not (len(local_offsets) == len(remote_offsets) == len(sizes)):
            status.Update(StatusCode.ERR_INVALID_ARGS, "offset and size lists differ in length")
            return status
        for lo, ro, n in zip(local_offsets, remote_offsets, sizes, strict=True):
            if n <= 0 or lo < 0 or ro < 0 or lo + n > local.size or ro + n > remote.size:
                status.Update(StatusCode.ERR_INVALID_ARGS, "offset/size out of range")
                return status
        if not sizes:
            status.Update(StatusCode.SUCCESS, "")
            return status
        self.stand_in.posts.append((op, uid, len(sizes), sum(sizes)))
        descriptors = list(zip(local_offsets, remote_offsets, sizes, strict=True))
        if session._route is BackendType.XGMI:
            self._xgmi(status, op, session, descriptors)
        else:
            self.rdma.submit(status, op, session, descriptors, uid)
        return status

    def _xgmi(
        self, status: TransferStatus, op: str, session: IOEngineSession, pieces: list[Any]
    ) -> None:
        """hipMemcpyAsync per descriptor on a stream; ``Code()`` polls the event."""
        remote_key = session._remote.engine_key
        polls = [self.stand_in.polls_to_complete]

        def progress(st: TransferStatus) -> None:
            if self.stand_in.hold or polls[0] > 0:
                polls[0] -= 0 if self.stand_in.hold else 1
                return
            target = stand_in.find(remote_key)
            mine = None if target is None else target._memory.get(session._remote.id)
            if mine is None or (mine.data, mine.size) != session._remote_mr:
                st.store(StatusCode.ERR_GPU_OP, "hipMemcpyAsync failed: invalid device pointer")
                return
            for lo, ro, n in pieces:
                if op == "read":
                    ctypes.memmove(session._local.data + lo, mine.data + ro, n)
                else:
                    ctypes.memmove(mine.data + ro, session._local.data + lo, n)
            st.store(StatusCode.SUCCESS, "")

        status.store(StatusCode.IN_PROGRESS, "")
        status._progress = progress
