"""Stand-in for ``mori.cpp``: enums, configs, descriptors and ``TransferStatus``.

Mirrors the pybind module's documented Python surface (mori 1.2.x). Descriptors pack to JSON
instead of msgpack; nothing outside this package reads the bytes.
"""

from __future__ import annotations

import enum
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any


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


class _Packable:
    _FIELDS: tuple[str, ...] = ()

    def pack(self) -> bytes:
        return json.dumps({f: getattr(self, f) for f in self._FIELDS}).encode()

    @classmethod
    def _from(cls, raw: bytes) -> Any:
        fields = json.loads(raw)
        obj = cls.__new__(cls)
        for f in cls._FIELDS:
            setattr(obj, f, fields[f])
        return obj

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.pack() == other.pack()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.pack())


class EngineDesc(_Packable):
    _FIELDS = ("key", "node_id", "hostname", "host", "port", "pid")

    def __init__(self, key: str, host: str, port: int) -> None:
        self.key = key
        self.node_id = os.environ.get("MORI_NODE_ID", socket.gethostname())
        self.hostname = socket.gethostname()
        self.host = host
        self.port = port
        self.pid = os.getpid()

    @staticmethod
    def unpack(raw: bytes) -> EngineDesc:
        desc: EngineDesc = EngineDesc._from(raw)
        return desc


class MemoryDesc(_Packable):
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

    def __init__(self) -> None:
        self.engine_key = ""
        self.id = 0
        self.device_id = -1
        self.device_bus_id = ""
        self.data = 0
        self.size = 0
        self.loc = int(MemoryLocationType.Unknown)
        self.numa_node = -1
        self.ipc_handle = b"\0" * 64

    @staticmethod
    def unpack(raw: bytes) -> MemoryDesc:
        desc: MemoryDesc = MemoryDesc._from(raw)
        desc.ipc_handle = b"\0" * 64
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
