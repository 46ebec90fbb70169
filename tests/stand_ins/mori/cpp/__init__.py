"""Stand-in for ``mori.cpp``: enums, configs, descriptors and ``TransferStatus``.

Mirrors the pybind module's Python surface (mori 1.2.x): descriptors are read-only, compare
with ``==`` but are unhashable, pack to msgpack and ``unpack`` only ``bytes``; ``MemoryDesc.loc``
is a ``MemoryLocationType``.
"""

from __future__ import annotations

import enum
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import msgpack


class StatusCode(enum.IntEnum):
    SUCCESS = 0
    INIT = 1
    IN_PROGRESS = 2
    ERR_INVALID_ARGS = 11
    ERR_NOT_FOUND = 12
    ERR_RDMA_OP = 13
    ERR_BAD_STATE = 14
    ERR_GPU_OP = 15


_ERR_BEGIN = 10


class BackendType(enum.IntEnum):
    Unknown = 0
    XGMI = 1
    RDMA = 2
    TCP = 3
    FABRIC = 4


class MemoryLocationType(enum.IntEnum):
    Unknown = 0
    CPU = 1
    GPU = 2


class PollCqMode(enum.IntEnum):
    POLLING = 0
    EVENT = 1


class IOEngineConfig:
    def __init__(self, host: str = "", port: int = 0) -> None:
        self.host = host
        self.port = port


class RdmaBackendConfig:
    def __init__(
        self,
        qp_per_transfer: int = 1,
        post_batch_size: int = -1,
        num_worker_threads: int = -1,
        poll_cq_mode: PollCqMode = PollCqMode.POLLING,
        enable_notification: bool = True,
        notif_per_qp: int = 1024,
        enable_transfer_chunking: bool = False,
        chunk_bytes: int = 65536,
        max_chunks_per_transfer: int = 64,
        num_nics_per_transfer: int = 1,
    ) -> None:
        self.qp_per_transfer = qp_per_transfer
        self.post_batch_size = post_batch_size
        self.num_worker_threads = num_worker_threads
        self.poll_cq_mode = poll_cq_mode
        self.enable_notification = enable_notification
        self.notif_per_qp = notif_per_qp
        self.enable_transfer_chunking = enable_transfer_chunking
        self.chunk_bytes = chunk_bytes
        self.max_chunks_per_transfer = max_chunks_per_transfer
        self.num_nics_per_transfer = num_nics_per_transfer
        self.max_send_wr = 0
        self.max_cqe_num = 0
        self.max_msg_sge = 0


class XgmiBackendConfig:
    def __init__(self, num_streams: int = 64, num_events: int = 64) -> None:
        self.num_streams = num_streams
        self.num_events = num_events


class FabricBackendConfig(XgmiBackendConfig):
    pass


class _Descriptor:
    """Read-only, unhashable (pybind ``==`` without ``__hash__``), msgpack ``pack``/``unpack``."""

    _FIELDS: tuple[str, ...] = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"can't set attribute {name!r} of {type(self).__name__}")

    def _set(self, **fields: object) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def pack(self) -> bytes:
        return bytes(msgpack.packb([_plain(getattr(self, f)) for f in self._FIELDS]))

    @classmethod
    def _unpack(cls, raw: bytes) -> Any:
        if type(raw) is not bytes:  # pybind's py::bytes accepts bytes only
            raise TypeError(
                f"unpack(): incompatible function arguments: expected bytes, got "
                f"{type(raw).__name__}"
            )
        try:
            values = msgpack.unpackb(raw)
            if not isinstance(values, list) or len(values) != len(cls._FIELDS):
                raise ValueError("wrong field count")
        except Exception as exc:  # msgpack-c throws; pybind turns it into RuntimeError
            raise RuntimeError(f"msgpack unpack failed: {exc}") from exc
        obj = cls.__new__(cls)
        obj._set(**dict(zip(cls._FIELDS, values, strict=True)))
        return obj

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.pack() == other.pack()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]


def _plain(value: object) -> object:
    return int(value) if isinstance(value, enum.IntEnum) else value


class EngineDesc(_Descriptor):
    _FIELDS = ("key", "node_id", "hostname", "host", "port", "pid")
    key: str
    node_id: str
    hostname: str
    host: str
    port: int
    pid: int

    def __init__(self, key: str, host: str, port: int) -> None:
        self._set(
            key=key,
            node_id=os.environ.get("MORI_NODE_ID", socket.gethostname()),
            hostname=socket.gethostname(),
            host=host,
            port=port,
            pid=os.getpid(),
        )

    @staticmethod
    def unpack(raw: bytes) -> EngineDesc:
        desc: EngineDesc = EngineDesc._unpack(raw)
        return desc


class MemoryDesc(_Descriptor):
    _FIELDS = (
        "engine_key",
        "id",
        "device_id",
        "device_bus_id",
        "data",
        "size",
        "loc",
        "numa_node",
    )
    engine_key: str
    id: int
    device_id: int
    device_bus_id: str
    data: int
    size: int
    loc: MemoryLocationType
    numa_node: int

    def __init__(self) -> None:
        self._set(
            engine_key="",
            id=0,
            device_id=-1,
            device_bus_id="",
            data=0,
            size=0,
            loc=MemoryLocationType.Unknown,
            numa_node=-1,
        )

    @property
    def ipc_handle(self) -> bytes:
        return b"\0" * 64

    @staticmethod
    def unpack(raw: bytes) -> MemoryDesc:
        desc: MemoryDesc = MemoryDesc._unpack(raw)
        desc._set(loc=MemoryLocationType(desc.loc))
        return desc


class TransferStatus:
    """Starts INIT; errors are sticky; ``Code()`` runs the progress callback."""

    def __init__(self) -> None:
        self._code = StatusCode.INIT
        self._message = ""
        self._progress: Callable[[TransferStatus], None] | None = None

    def __copy__(self) -> TransferStatus:
        raise TypeError("TransferStatus is not copyable")

    def __deepcopy__(self, memo: object) -> TransferStatus:
        raise TypeError("TransferStatus is not copyable")

    def Code(self) -> StatusCode:  # noqa: N802 -- mori's spelling
        if self._progress is not None:
            self._progress(self)
        return self._code

    def Message(self) -> str:  # noqa: N802
        return self._message

    def Init(self) -> bool:  # noqa: N802
        return self._code == StatusCode.INIT

    def InProgress(self) -> bool:  # noqa: N802
        return self._code == StatusCode.IN_PROGRESS

    def Succeeded(self) -> bool:  # noqa: N802
        return self._code == StatusCode.SUCCESS

    def Failed(self) -> bool:  # noqa: N802
        return self._code > _ERR_BEGIN

    def Update(self, code: StatusCode, message: str) -> None:  # noqa: N802
        if self.Failed():
            return
        self._code = StatusCode(code)
        self._message = message
        if self._code not in (StatusCode.INIT, StatusCode.IN_PROGRESS):
            self._progress = None

    def SetCode(self, code: StatusCode) -> None:  # noqa: N802
        self._code = StatusCode(code)

    def SetMessage(self, message: str) -> None:  # noqa: N802
        self._message = message

    def Wait(self) -> None:  # noqa: N802
        while self.Code() in (StatusCode.INIT, StatusCode.IN_PROGRESS):
            time.sleep(0)

    def WaitFor(self, timeout_ms: int = -1) -> StatusCode:  # noqa: N802
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        while True:
            code = self.Code()
            if code not in (StatusCode.INIT, StatusCode.IN_PROGRESS):
                return code
            if deadline is not None and time.monotonic() >= deadline:
                return StatusCode.IN_PROGRESS
            time.sleep(0)


def set_log_level(level: str) -> None:
    """Accepted and ignored."""
