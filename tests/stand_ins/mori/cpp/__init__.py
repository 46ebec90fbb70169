"""Stand-in for ``mori.cpp``: enums, configs, descriptors, ``TransferStatus`` and the 1.2.4
peer-failure types.

Mirrors the pybind module's Python surface (amd-mori 1.2.4, ``src/pybind/pybind_io.cpp`` and
the wheel's ``_jit-sources/include/mori/io`` headers): descriptors are read-only, compare with
``==`` but are unhashable and unpack leniently (see :mod:`mori.cpp.descriptors`);
``MemoryDesc.loc`` is a ``MemoryLocationType``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from mori.cpp.descriptors import EngineDesc, MemoryDesc, MemoryLocationType

__all__ = [
    "BackendType",
    "EngineDesc",
    "FabricBackendConfig",
    "IOEngineConfig",
    "MemoryDesc",
    "MemoryLocationType",
    "PeerFailureEvent",
    "PeerFailureReason",
    "PollCqMode",
    "RdmaBackendConfig",
    "StatusCode",
    "TransferStatus",
    "XgmiBackendConfig",
    "set_log_level",
]


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


class PeerFailureReason(enum.IntEnum):
    """``include/mori/io/peer_failure.hpp``: why a peer (or what reaches it) is unusable."""

    UNKNOWN = 0
    PEER_UNREACHABLE = 1  # the peer did not ack within the retry budget (RETRY_EXC)
    LOCAL_QP_ERROR = 2  # IBV_EVENT_QP_FATAL / QP_REQ_ERR / QP_ACCESS_ERR
    LOCAL_PORT_DOWN = 3  # IBV_EVENT_PORT_ERR; cleared once the port is up again
    LOCAL_DEVICE_FATAL = 4  # IBV_EVENT_DEVICE_FATAL
    LOCAL_CQ_ERROR = 5  # IBV_EVENT_CQ_ERR


@dataclass(frozen=True)
class PeerFailureEvent:
    """What ``IOEngine.pop_peer_failure()`` hands out; ``remote_engine_key`` is empty when the
    event is not QP-scoped (a port, CQ or device failure covers every peer behind it)."""

    remote_engine_key: str
    reason: PeerFailureReason
    qp_num: int = 0
    port_num: int = 0
    device_name: str = ""
    detail: str = ""


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
        self.store(code, message)  # then notify_all(): nothing waits on a stand-in status

    def store(self, code: StatusCode, message: str) -> None:
        """The first half of ``TransferStatus::Update``: the code and message, under the
        lock. mori's completion thread calls ``notify_all()`` on the status only after the
        lock is released (see :mod:`mori.io.rdma`)."""
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
