"""Stand-in for ``mori.io.engine``: ``IOEngine`` and ``IOEngineSession``.

Semantics reproduced from mori 1.2.x: statuses start INIT and are returned IN_PROGRESS,
complete when ``Code()`` is polled (the progress callback), fail synchronously on a full send
queue or bad arguments, and stay failed (sticky). ``create_session`` returns None when no
backend can route the pair. Bytes really move between CPU memory of engines in this process.
"""

from __future__ import annotations

import ctypes
import itertools
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
_MAX_SEND_WR = 8192


def _sq_full_message(requested: int, config: RdmaBackendConfig) -> str:
    return (
        f"SQ full (batch): ep=0 depth={_MAX_SEND_WR} requested={requested} max={_MAX_SEND_WR} "
        "Hint: try increasing MORI_IO_QP_MAX_SEND_WR, reducing "
        f"RdmaBackendConfig::postBatchSize (current effective value {config.post_batch_size}), "
        f"or increasing RdmaBackendConfig::qpPerTransfer (current {config.qp_per_transfer}). "
        f"Current per-QP send WR limit is {_MAX_SEND_WR}."
    )


class IOEngineSession:
    """Pre-resolved (local, remote) pair. Transfer methods take positional arguments only."""

    def __init__(self, engine: IOEngine, local: MemoryDesc, remote: MemoryDesc) -> None:
        self._engine = engine
        self._local = local
        self._remote = remote

    def allocate_transfer_uid(self) -> int:
        return self._engine.allocate_transfer_uid()

    def read(self, *args: int) -> TransferStatus:
        lo, ro, size, uid = args
        return self._engine._submit("read", self._local, [lo], self._remote, [ro], [size], uid)

    def write(self, *args: int) -> TransferStatus:
        lo, ro, size, uid = args
        return self._engine._submit("write", self._local, [lo], self._remote, [ro], [size], uid)

    def batch_read(self, *args: Any) -> TransferStatus:
        lo, ro, sizes, uid = args
        return self._engine._submit("read", self._local, lo, self._remote, ro, sizes, uid)

    def batch_write(self, *args: Any) -> TransferStatus:
        lo, ro, sizes, uid = args
        return self._engine._submit("write", self._local, lo, self._remote, ro, sizes, uid)

    def alive(self) -> bool:
        return True


class IOEngine:
    def __init__(self, key: str, config: IOEngineConfig) -> None:
        port = config.port or next(_PORTS)
        self._desc = EngineDesc(key, config.host, port)
        self.stand_in = stand_in.Control()
        self._remotes: dict[str, EngineDesc] = {}
        self._memory: dict[int, MemoryDesc] = {}
        self._ids = itertools.count(1)
        self._uids = itertools.count(1)
        self._inbound: set[tuple[str, int]] = set()
        stand_in.attach(self)

    def get_engine_desc(self) -> EngineDesc:
        return self._desc

    def create_backend(self, type: BackendType, config: Any = None) -> None:
        if type not in (BackendType.RDMA, BackendType.XGMI, BackendType.FABRIC):
            raise NotImplementedError("backend not implemented yet")
        if type is BackendType.RDMA and self._desc.port == 1:
            raise RuntimeError("IOEngineConfig.port=1 is reserved for the XGMI-only fallback")
        if config is None:
            config = RdmaBackendConfig() if type is BackendType.RDMA else XgmiBackendConfig()
        self.stand_in.backends[type] = config

    def remove_backend(self, type: BackendType) -> None:
        self.stand_in.backends.pop(type, None)

    def register_remote_engine(self, engine_desc: EngineDesc) -> None:
        self._remotes[engine_desc.key] = engine_desc

    def deregister_remote_engine(self, engine_desc: EngineDesc) -> None:
        self._remotes.pop(engine_desc.key, None)

    def register_memory(
        self, ptr: int, size: int, device_id: int, mem_loc: MemoryLocationType
    ) -> MemoryDesc:
        desc = MemoryDesc()
        desc.engine_key = self._desc.key
        desc.id = next(self._ids)
        desc.device_id = device_id
        desc.device_bus_id = (
            "" if mem_loc == MemoryLocationType.CPU else f"0000:{device_id:02x}:00.0"
        )
        desc.data = ptr
        desc.size = size
        desc.loc = int(mem_loc)
        desc.numa_node = 0 if mem_loc == MemoryLocationType.CPU else -1
        self._memory[desc.id] = desc
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

    def allocate_transfer_uid(self) -> int:
        return next(self._uids)

    def read(self, *args: Any) -> TransferStatus:
        local, lo, remote, ro, size, uid = args
        return self._submit("read", local, [lo], remote, [ro], [size], uid)

    def write(self, *args: Any) -> TransferStatus:
        local, lo, remote, ro, size, uid = args
        return self._submit("write", local, [lo], remote, [ro], [size], uid)

    def batch_read(self, *args: Any) -> list[TransferStatus]:
        return self._batch("read", *args)

    def batch_write(self, *args: Any) -> list[TransferStatus]:
        return self._batch("write", *args)

    def create_session(self, local_mem: MemoryDesc, remote_mem: MemoryDesc) -> Any:
        if self._route(local_mem, remote_mem) is None:
            return None
        self.stand_in.sessions_created += 1
        return IOEngineSession(self, local_mem, remote_mem)

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

    def _route(self, local: MemoryDesc, remote: MemoryDesc) -> BackendType | None:
        backends = self.stand_in.backends
        gpu_pair = local.loc == remote.loc == int(MemoryLocationType.GPU)
        peer = self._remotes.get(remote.engine_key)
        same_node = peer is not None and peer.node_id == self._desc.node_id
        if BackendType.XGMI in backends and gpu_pair and same_node:
            return BackendType.XGMI
        if BackendType.RDMA in backends and peer is not None and peer.port != 1:
            return BackendType.RDMA
        return None

    def _batch(self, op: str, *args: Any) -> list[TransferStatus]:
        locals_, los, remotes, ros, sizes, uids = args
        assert len(locals_) == len(los) == len(remotes) == len(ros) == len(sizes) == len(uids)
        return [
            self._submit(op, *pair)
            for pair in zip(locals_, los, remotes, ros, sizes, uids, strict=True)
        ]

    def _submit(
        self,
        op: str,
        local: MemoryDesc,
        local_offsets: list[int],
        remote: MemoryDesc,
        remote_offsets: list[int],
        sizes: list[int],
        uid: int,
    ) -> TransferStatus:
        status = TransferStatus()
        route = self._route(local, remote)
        if route is None:
            status.Update(
                StatusCode.ERR_BAD_STATE, "No available backend found, create backend first"
            )
            return status
        if not (len(local_offsets) == len(remote_offsets) == len(sizes)):
            status.Update(StatusCode.ERR_INVALID_ARGS, "offset and size lists differ in length")
            return status
        for lo, ro, n in zip(local_offsets, remote_offsets, sizes, strict=True):
            if n <= 0 or lo < 0 or ro < 0 or lo + n > local.size or ro + n > remote.size:
                status.Update(StatusCode.ERR_INVALID_ARGS, "offset/size out of range")
                return status
        control = self.stand_in
        control.posts.append((op, uid, len(sizes), sum(sizes)))
        config = control.backends.get(BackendType.RDMA)
        if control.sq_full_burst > 0 and route is BackendType.RDMA:
            control.sq_full_burst -= 1
            status.Update(StatusCode.ERR_RDMA_OP, _sq_full_message(len(sizes), config))
            return status
        failure = None
        if control.fail_next > 0:
            control.fail_next -= 1
            failure = (StatusCode(control.fail_code), control.fail_message)
        polls = [control.polls_to_complete]
        job = (op, local, list(local_offsets), remote, list(remote_offsets), list(sizes), uid)

        def progress(st: TransferStatus) -> None:
            if polls[0] > 0:
                polls[0] -= 1
                return
            if failure is not None:
                st.Update(*failure)
            else:
                st.Update(*self._complete(*job))

        status.Update(StatusCode.IN_PROGRESS, "")
        status._progress = progress
        return status

    def _complete(
        self,
        op: str,
        local: MemoryDesc,
        local_offsets: list[int],
        remote: MemoryDesc,
        remote_offsets: list[int],
        sizes: list[int],
        uid: int,
    ) -> tuple[StatusCode, str]:
        target = stand_in.find(remote.engine_key)
        if target is None or remote.engine_key not in self._remotes:
            return StatusCode.ERR_RDMA_OP, (
                "ibv_wc_status: transport retry counter exceeded (RETRY_EXC) "
                "Hint: check that the peer is alive and MORI_IB_GID_INDEX"
            )
        if local.id not in self._memory or remote.id not in target._memory:
            return StatusCode.ERR_RDMA_OP, "ibv_wc_status: remote access error (REM_ACCESS_ERR)"
        for lo, ro, n in zip(local_offsets, remote_offsets, sizes, strict=True):
            if op == "read":
                ctypes.memmove(local.data + lo, remote.data + ro, n)
            else:
                ctypes.memmove(remote.data + ro, local.data + lo, n)
        config = self.stand_in.backends.get(BackendType.RDMA)
        if config is not None and config.enable_notification:
            target._inbound.add((self._desc.key, uid))
        return StatusCode.SUCCESS, ""
