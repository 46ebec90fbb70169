"""Stand-in for ``mori.io.engine``: ``IOEngine`` and ``IOEngineSession``.

Reproduces what mori 1.2.x does, as read from its source (``src/io/engine.cpp``,
``src/io/rdma/{backend_impl,common}.cpp``), and really copies bytes between CPU memory:

* RDMA ``create_backend`` fails without an active NIC; ``MORI_IO_*`` variables override the
  config. ``register_memory`` only records the descriptor; ids start at 0 per engine.
* Queue pairs are kept per remote engine *key* and are never pruned:
  ``deregister_remote_engine`` only forgets the control-plane entry. ``create_session`` builds
  missing QPs by dialling the registered host:port (it blocks, and raises ``RuntimeError`` when
  nothing answers) and caches the remote region's key by (engine key, region id).
* A batch is posted as chains of ``post_batch_size`` WRs spread over the session's QPs; a full
  send queue fails the status synchronously after the earlier chains were already posted.
* A posted WR completes on a later completion-queue pass (any ``Code()`` call). An error
  completion (dead peer, deregistered memory, injected failure) puts the QP into ERROR and
  every later WR on it is flushed. Completions write through the status like mori's raw
  pointer: one that finds the status freed is counted in ``dangling_writes``.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from mori import stand_in
from mori.cpp import (
    BackendType,
    EngineDesc,
    IOEngineConfig,
    MemoryDesc,
    MemoryLocationType,
    RdmaBackendConfig,
    StatusCode,
    TransferStatus,
    XgmiBackendConfig,
)

_PORTS = itertools.count(47000)
_DEFAULT_SEND_WR = 8192
_RETRY_EXC = (
    "transport retry counter exceeded (RETRY_EXC) Hint: check that the peer is alive and "
    "MORI_IB_GID_INDEX"
)
_ENV_INT = {
    "MORI_IO_QP_PER_TRANSFER": "qp_per_transfer",
    "MORI_IO_POST_BATCH_SIZE": "post_batch_size",
    "MORI_IO_NUM_WORKER_THREADS": "num_worker_threads",
    "MORI_IO_QP_MAX_SEND_WR": "max_send_wr",
}
_ENV_BOOL = {
    "MORI_IO_ENABLE_NOTIFICATION": "enable_notification",
    "MORI_IO_ENABLE_CHUNKING": "enable_transfer_chunking",
}


def _effective(config: RdmaBackendConfig) -> RdmaBackendConfig:
    """What mori's RdmaBackend constructor does: environment variables win over the config."""
    out = RdmaBackendConfig()
    out.__dict__.update(config.__dict__)
    for var, name in _ENV_INT.items():
        if var in os.environ:
            setattr(out, name, int(os.environ[var]))
    for var, name in _ENV_BOOL.items():
        if var in os.environ:
            setattr(out, name, os.environ[var].lower() in ("1", "true", "yes", "on"))
    return out


@dataclass(eq=False)
class _Qp:
    """One RC queue pair, connected to whatever engine answered when it was built."""

    target: IOEngine
    error: str | None = None


@dataclass(eq=False)
class _Meta:
    """mori's CqCallbackMeta: a raw pointer to the status plus the completion count."""

    status: weakref.ref[TransferStatus] | None
    total: int
    done: int = 0


@dataclass(eq=False)
class _Wr:
    qp: _Qp
    meta: _Meta
    op: str
    local: MemoryDesc
    remote: MemoryDesc
    descriptors: list[tuple[int, int, int]]
    polls: int
    fail: str | None
    remote_mr: tuple[int, int]  # (data, size) the cached remote key was issued for


class IOEngineSession:
    """Pre-resolved (local, remote) pair over a fixed set of QPs; positional arguments only."""

    def __init__(
        self,
        engine: IOEngine,
        local: MemoryDesc,
        remote: MemoryDesc,
        qps: list[_Qp],
        remote_mr: tuple[int, int],
    ) -> None:
        self._engine = engine
        self._local = local
        self._remote = remote
        self._qps = qps
        self._remote_mr = remote_mr

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
        return True


class IOEngine:
    def __init__(self, key: str, config: IOEngineConfig) -> None:
        port = config.port or next(_PORTS)
        self._desc = EngineDesc(key, config.host, port)
        self.stand_in = stand_in.Control()
        self._remotes: dict[str, EngineDesc] = {}
        self._memory: dict[int, MemoryDesc] = {}
        self._ids = itertools.count(0)
        self._uids = itertools.count(0)
        self._qps: dict[str, list[_Qp]] = {}  # remote engine key -> QPs, never pruned
        self._remote_mrs: dict[tuple[str, int], tuple[int, int]] = {}  # never pruned
        self._cq: list[_Wr] = []
        self._cq_lock = threading.Lock()
        self._inbound: set[tuple[str, int]] = set()
        stand_in.attach(self, port)

    def get_engine_desc(self) -> EngineDesc:
        return self._desc

    def create_backend(self, type: BackendType, config: Any = None) -> None:
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
            config = _effective(config or RdmaBackendConfig())
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
        route = self._route(local_mem, remote_mem)
        if route is None:
            return None
        gate = self.stand_in.session_gate
        if gate is not None:
            gate.wait()
        config = self.stand_in.backends.get(BackendType.RDMA)
        wanted = config.qp_per_transfer if route is BackendType.RDMA else 1
        peer = self._remotes[remote_mem.engine_key]
        qps = self._qps.setdefault(remote_mem.engine_key, [])
        while len(qps) < wanted:  # BuildRdmaConn: TCP connect + QP exchange
            qps.append(_Qp(self._dial(peer)))
            self.stand_in.qps_built += 1
        key = (remote_mem.engine_key, remote_mem.id)
        if key not in self._remote_mrs:  # AskRemoteMemoryRegion
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
            self._remote_mrs[key] = (mine.data, mine.size)
        self.stand_in.sessions_created += 1
        return IOEngineSession(self, local_mem, remote_mem, qps[:wanted], self._remote_mrs[key])

    def pop_inbound_transfer_status(self, remote_key: str, transfer_uid: int) -> Any:
        if (remote_key, transfer_uid) not in self._inbound:
            return None
        status = TransferStatus()
        status.Update(StatusCode.SUCCESS, "")
        return status

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
        if BackendType.XGMI in backends and gpu_pair and same_node:
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
        control = self.stand_in
        control.posts.append((op, uid, len(sizes), sum(sizes)))
        config = control.backends.get(BackendType.RDMA) or RdmaBackendConfig()
        descriptors = list(zip(local_offsets, remote_offsets, sizes, strict=True))
        qps = session._qps
        per_qp = -(-len(descriptors) // len(qps))
        batch = per_qp if config.post_batch_size == -1 else config.post_batch_size
        batch = max(1, min(batch, config.max_send_wr or _DEFAULT_SEND_WR))
        chains = [descriptors[i : i + batch] for i in range(0, len(descriptors), batch)]
        meta = _Meta(weakref.ref(status), len(descriptors))
        status.Update(StatusCode.IN_PROGRESS, "")
        status._progress = lambda _st: self._drive()
        for index, chain in enumerate(chains):
            if control.sq_full_burst > 0 and index == min(control.sq_full_chain, len(chains) - 1):
                control.sq_full_burst -= 1
                if control.sq_gate is not None:
                    control.sq_gate.wait()  # MORI_IO_SQ_BACKOFF_TIMEOUT_US
                status.Update(StatusCode.ERR_RDMA_OP, _sq_full_message(len(chain), config))
                return status
            qp = qps[(index + uid) % len(qps)]
            fail = None
            if control.fail_next > 0:
                control.fail_next -= 1
                fail = control.fail_message
            wr = _Wr(qp, meta, op, local, remote, chain, control.polls_to_complete, fail,
                     session._remote_mr)  # fmt: skip
            with self._cq_lock:
                self._cq.append(wr)
        return status

    def _drive(self) -> None:
        """One completion-queue pass over every posted WR."""
        if self.stand_in.hold:
            return
        with self._cq_lock:
            ready = [wr for wr in self._cq if wr.polls <= 0]
            for wr in self._cq:
                wr.polls -= 1
            self._cq = [wr for wr in self._cq if wr not in ready]
        for wr in ready:
            self._complete(wr)

    def _complete(self, wr: _Wr) -> None:
        error = wr.qp.error and "work request flushed in error (WR_FLUSH_ERR)"
        target = wr.qp.target
        if error is None and not stand_in.alive(target):
            error = _RETRY_EXC
        if error is None and wr.fail is not None:
            error = wr.fail
        if error is None and self._memory.get(wr.local.id) != wr.local:
            error = "local protection error (LOC_PROT_ERR)"
        mine = target._memory.get(wr.remote.id)
        if error is None and (mine is None or (mine.data, mine.size) != wr.remote_mr):
            error = "remote access error (REM_ACCESS_ERR)"
        if error is not None:
            wr.qp.error = wr.qp.error or error
            self._write_status(wr.meta, StatusCode.ERR_RDMA_OP, error)
            wr.meta.status = None  # mori clears the pointer after the first error
            return
        for lo, ro, n in wr.descriptors:
            if wr.op == "read":
                ctypes.memmove(wr.local.data + lo, wr.remote.data + ro, n)
            else:
                ctypes.memmove(wr.remote.data + ro, wr.local.data + lo, n)
        wr.meta.done += len(wr.descriptors)
        if wr.meta.done == wr.meta.total:
            self._write_status(wr.meta, StatusCode.SUCCESS, "")

    def _write_status(self, meta: _Meta, code: StatusCode, message: str) -> None:
        if meta.status is None:
            return
        status = meta.status()
        if status is None:
            self.stand_in.dangling_writes += 1  # a use-after-free in real mori
            return
        status.Update(code, message)


def _sq_full_message(requested: int, config: RdmaBackendConfig) -> str:
    depth = config.max_send_wr or _DEFAULT_SEND_WR
    return (
        f"SQ full (batch): ep=0 depth={depth} requested={requested} max={depth} "
        "Hint: if completions should drain soon, try a larger MORI_IO_SQ_BACKOFF_TIMEOUT_US "
        "(current 5000000 us); otherwise try increasing MORI_IO_QP_MAX_SEND_WR, reducing "
        f"RdmaBackendConfig::postBatchSize (current effective value {config.post_batch_size}), "
        f"or increasing RdmaBackendConfig::qpPerTransfer (current {config.qp_per_transfer}). "
        f"Current per-QP send WR limit is {depth}."
    )
