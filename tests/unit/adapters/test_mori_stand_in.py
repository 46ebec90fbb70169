"""The stand-in mori against mori 1.2.4's own behaviour, through mori's Python API only.

Each test names the mori source or symbol it copies (ROCm/mori ``src/io``, the amd-mori
1.2.4 wheel's bindings, headers and strings). A stand-in is only as good as this table.
"""

from __future__ import annotations

import socket
import time
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from support.mori_pair import eventually

SIZE = 4096


class Raw:
    """Two raw stand-in engines (``a`` reads from ``b``) and one session between them."""

    def __init__(self, qps: int = 1, backend: str = "RDMA", gpu: bool = False) -> None:
        from mori.io import (
            BackendType,
            IOEngine,
            IOEngineConfig,
            MemoryLocationType,
            RdmaBackendConfig,
        )

        kind = getattr(BackendType, backend)
        config = RdmaBackendConfig(qp_per_transfer=qps) if backend == "RDMA" else None
        self.a = IOEngine("raw-a", IOEngineConfig(host="127.0.0.1", port=0))
        self.b = IOEngine("raw-b", IOEngineConfig(host="127.0.0.1", port=0))
        for engine in (self.a, self.b):
            engine.create_backend(kind, config)
        self.a.register_remote_engine(self.b.get_engine_desc())
        loc = MemoryLocationType.GPU if gpu else MemoryLocationType.CPU
        self.a_buf, self.b_buf = np.zeros(SIZE, np.uint8), np.arange(SIZE).astype(np.uint8)
        self.mine = self.a.register_memory(self.a_buf.ctypes.data, SIZE, 0 if gpu else -1, loc)
        self.theirs = self.b.register_memory(self.b_buf.ctypes.data, SIZE, 0 if gpu else -1, loc)
        self.session = self.a.create_session(self.mine, self.theirs)

    def read(self, offsets: list[int], sizes: list[int]) -> Any:
        return self.session.batch_read(
            offsets, offsets, sizes, self.session.allocate_transfer_uid()
        )


def _done(status: Any) -> None:
    eventually(lambda: not status.InProgress(), "mori's thread completed the batch")


def test_rdma_completions_come_from_mori_s_own_thread(mori_stand_in: ModuleType) -> None:
    """``RdmaBackend``'s CQ poller completes work; ``InProgress()`` reads the code only."""
    raw = Raw()
    status = raw.read([0], [SIZE])
    _done(status)  # nobody called Code()
    assert status.Succeeded()
    np.testing.assert_array_equal(raw.a_buf, raw.b_buf)


def test_a_fatal_async_event_retires_the_endpoint(mori_stand_in: ModuleType) -> None:
    """1.2.4, ``MORI_IO_FAIL_ON_ASYNC_EVENT``: in-flight work fails, later posts are refused,
    ``IOEngineSession::Alive`` is False, ``PopPeerFailure`` reports it
    (``include/mori/io/peer_failure.hpp``)."""
    from mori.io import PeerFailureReason

    raw = Raw()
    mori_stand_in.control("raw-a").hold = True
    in_flight = raw.read([0], [SIZE])
    assert raw.session.alive()
    mori_stand_in.fatal_event("raw-a", "LOCAL_QP_ERROR", peer="raw-b")
    assert "endpoint retired by a fatal async event" in in_flight.Message()
    assert not raw.session.alive()
    refused = raw.read([0], [SIZE])
    assert refused.Failed()
    assert refused.Message() == (
        "endpoint was failed by a fatal verbs async event; submission rejected"
    )
    event = raw.a.pop_peer_failure()
    assert (event.remote_engine_key, event.reason) == ("raw-b", PeerFailureReason.LOCAL_QP_ERROR)
    assert raw.a.pop_peer_failure() is None  # None: nothing (more) seen, not "healthy"


def test_a_retry_exceeded_completion_reports_the_peer_unreachable(
    mori_stand_in: ModuleType,
) -> None:
    from mori.io import PeerFailureReason

    raw = Raw()
    mori_stand_in.crash("raw-b")
    status = raw.read([0], [SIZE])
    _done(status)
    assert "RETRY_EXC" in status.Message()
    assert raw.a.pop_peer_failure().reason == PeerFailureReason.PEER_UNREACHABLE
    assert not raw.session.alive()


def test_a_degraded_endpoint_refuses_until_its_orphans_are_released(
    mori_stand_in: ModuleType,
) -> None:
    """``TryReserveSqDepth``: "EP is degraded, rejecting new submissions" until
    ``ProcessOneCqe`` "recovered degraded EP ... by releasing orphaned WRs"."""
    raw = Raw()
    mori_stand_in.degrade("raw-a", "raw-b", passes=20)
    assert raw.read([0], [SIZE]).Message() == "EP is degraded, rejecting new submissions"
    control = mori_stand_in.control("raw-a")
    eventually(lambda: any("recovered degraded EP" in w for w in control.warnings), "recovery")
    status = raw.read([0], [SIZE])
    _done(status)
    assert status.Succeeded()


def test_a_batch_is_sorted_by_remote_offset_and_merged(mori_stand_in: ModuleType) -> None:
    """``RdmaBatchReadWrite``: std::sort by remote offset, then contiguous runs merge."""
    raw = Raw()
    quarter = SIZE // 4
    _done(raw.read([3 * quarter, quarter, 0, 2 * quarter], [quarter] * 4))
    _done(raw.read([0, 2 * quarter], [quarter, quarter]))  # a gap: two work requests
    assert mori_stand_in.control("raw-a").work_requests == [1, 2]


def test_chains_rotate_over_the_queue_pairs_by_uid(mori_stand_in: ModuleType) -> None:
    """Chain ``i`` goes to ep ``(i + uid) % qps``: "SQ full (batch): ep=E" names it."""
    raw = Raw(qps=2)
    control = mori_stand_in.control("raw-a")
    for uid_shift in range(2):
        control.sq_full_burst, control.sq_full_chain = 1, 1
        uid = raw.session.allocate_transfer_uid()
        status = raw.session.batch_read([0, 2048], [0, 2048], [1024, 1024], uid)
        assert f"ep={(1 + uid) % 2} " in status.Message(), uid_shift


def test_the_send_queue_is_as_deep_as_the_device_allows(
    mori_stand_in: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GetRdmaEndpointConfig``: min(MORI_IO_QP_MAX_SEND_WR or config or 8192, max_qp_wr)."""
    mori_stand_in.DEVICE = mori_stand_in.Device("ionic_0", max_qp_wr=32767)
    monkeypatch.setenv("MORI_IO_QP_MAX_SEND_WR", "65536")
    assert Raw().a.rdma.depth == 32767
    monkeypatch.setenv("MORI_IO_QP_MAX_SEND_WR", "0")  # ParsePositiveU32 rejects 0
    mori_stand_in.reset()
    mori_stand_in.DEVICE = mori_stand_in.Device("ionic_0", max_qp_wr=32767)
    raw = Raw()
    assert raw.a.rdma.depth == 8192
    assert any("ionic NIC detected with qpPerTransfer=1" in w for w in raw.a.stand_in.warnings)


def test_a_merged_request_beyond_max_msg_sz_is_refused_unless_chunked(
    mori_stand_in: ModuleType,
) -> None:
    mori_stand_in.DEVICE = mori_stand_in.Device(max_msg_sz=1024)
    status = Raw().read([0], [SIZE])
    assert status.Failed()
    assert "exceeds local max_msg_sz 1024" in status.Message()


@pytest.mark.parametrize(("raw", "ignored"), [("0", True), ("7x", True), ("", True), ("3", False)])
def test_environment_values_are_parsed_as_mori_does(
    mori_stand_in: ModuleType, monkeypatch: pytest.MonkeyPatch, raw: str, ignored: bool
) -> None:
    """``env::Override`` with ``ParsePositiveInt``: invalid values keep the config's."""
    from mori.io import BackendType

    monkeypatch.setenv("MORI_IO_QP_PER_TRANSFER", raw)
    engine = Raw(qps=2).a
    assert engine.stand_in.backends[BackendType.RDMA].qp_per_transfer == (2 if ignored else 3)


def test_node_id_is_mori_node_id_then_boot_id_then_host_name(
    mori_stand_in: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``mori::ResolveNodeId`` (``src/application/context/context.cpp``)."""
    from mori.cpp import descriptors

    monkeypatch.setenv("MORI_NODE_ID", "rack7")
    assert descriptors.node_id() == "rack7"
    monkeypatch.delenv("MORI_NODE_ID")
    boot = tmp_path / "boot_id"
    boot.write_text("3f1c\n")
    monkeypatch.setattr(descriptors, "_BOOT_ID", boot)
    assert descriptors.node_id() == "3f1c"
    monkeypatch.setattr(descriptors, "_BOOT_ID", tmp_path / "absent")
    assert descriptors.node_id() == socket.gethostname()


def test_xgmi_dials_nothing_and_reports_gpu_failures(mori_stand_in: ModuleType) -> None:
    """XGMI maps the peer's memory through its IPC handle: no control plane; a copy that
    cannot reach it is ``ERR_GPU_OP`` (no ``RETRY_EXC``), driven by ``Code()``."""
    from mori.io import StatusCode

    raw = Raw(backend="XGMI", gpu=True)
    assert mori_stand_in.control("raw-a").dials == 0
    ok = raw.read([0], [SIZE])
    assert ok.WaitFor(1000) == StatusCode.SUCCESS  # the hipEvent, polled by Code()
    raw.b.deregister_memory(raw.theirs)
    failed = raw.read([0], [SIZE])
    assert failed.WaitFor(1000) == StatusCode.ERR_GPU_OP


def test_a_completion_notifies_a_status_after_storing_its_code(
    mori_stand_in: ModuleType,
) -> None:
    """``TransferStatus::Update``: store under the lock, unlock, then ``notify_all()`` (a
    status freed in between is a use-after-free, counted in ``dangling_writes``)."""
    raw = Raw()
    mori_stand_in.control("raw-a").polls_to_complete = 0
    status = raw.read([0], [SIZE])
    while status.InProgress():
        time.sleep(0)  # spin until the code is stored, then drop the status at once
    del status
    control = mori_stand_in.control("raw-a")
    eventually(lambda: control.notified == 1, "the notify ran")
    assert control.dangling_writes == 1
