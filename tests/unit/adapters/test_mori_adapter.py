"""mori adapter over the stand-in mori package: configs, sessions, uids, statuses."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from moriio.adapters.mori import MoriTransferEngine
from moriio.ports import (
    LocalRegion,
    MemoryKind,
    RemoteRegion,
    TransferEngine,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)

SIZE = 8192


class Pair:
    def __init__(self, **engine_kwargs: Any) -> None:
        self.a = MoriTransferEngine("a", **engine_kwargs)
        self.b = MoriTransferEngine("b", **engine_kwargs)
        self.a_buf = np.zeros(SIZE, np.uint8)
        self.b_buf = np.arange(SIZE, dtype=np.int64).astype(np.uint8)
        self.a_region = self.a.register_region(self.a_buf.ctypes.data, SIZE)
        self.b_region = self.b.register_region(self.b_buf.ctypes.data, SIZE)
        self.b.add_peer(self.a.metadata())
        self.peer = self.a.add_peer(self.b.metadata())
        self.remote = self.a.import_region(self.peer, self.b_region.descriptor)

    def read(
        self, local: LocalRegion | None = None, remote: RemoteRegion | None = None
    ) -> TransferHandle:
        one = np.zeros(1, np.int64)
        return self.a.post(
            TransferOp.READ,
            local or self.a_region,
            remote or self.remote,
            one,
            one,
            np.array([SIZE], np.int64),
            "t",
        )

    def finish(self, handle: TransferHandle) -> TransferStatus:
        for _ in range(100):
            status = self.a.poll(handle)
            if status.state is not TransferState.IN_PROGRESS:
                return status
        raise AssertionError("stand-in transfer did not complete")


@pytest.fixture
def pair(mori_stand_in: ModuleType) -> Pair:
    return Pair()


def test_conforms_to_the_port(mori_stand_in: ModuleType) -> None:
    engine: TransferEngine = MoriTransferEngine("k")
    assert engine.name == "k"


def test_rdma_backend_is_built_from_keyword_configs(
    mori_stand_in: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mori.io

    seen: dict[str, dict[str, Any]] = {}

    def keyword_only(name: str) -> type:
        base = getattr(mori.io, name)

        class KeywordOnly(base):  # type: ignore[misc, valid-type]
            def __init__(self, *args: object, **kwargs: object) -> None:
                assert not args, f"{name} got positional arguments {args}"
                seen[name] = dict(kwargs)
                super().__init__(**kwargs)

        return KeywordOnly

    for name in ("IOEngineConfig", "RdmaBackendConfig", "XgmiBackendConfig"):
        monkeypatch.setattr(mori.io, name, keyword_only(name))

    MoriTransferEngine("k", host="10.0.0.7", port=7000, qp_per_transfer=4, post_batch_size=32)

    assert seen["IOEngineConfig"] == {"host": "10.0.0.7", "port": 7000}
    assert seen["RdmaBackendConfig"]["enable_notification"] is False
    assert seen["RdmaBackendConfig"]["qp_per_transfer"] == 4
    assert seen["RdmaBackendConfig"]["post_batch_size"] == 32
    backends = mori_stand_in.control("k").backends
    assert list(backends) == [mori.io.BackendType.RDMA]
    assert backends[mori.io.BackendType.RDMA].poll_cq_mode == mori.io.PollCqMode.POLLING


def test_xgmi_option_and_its_missing_route_for_cpu_memory(mori_stand_in: ModuleType) -> None:
    from mori.io import BackendType

    pair = Pair(backend="xgmi", xgmi_num_streams=8)
    config = mori_stand_in.control("a").backends[BackendType.XGMI]
    assert config.num_streams == 8
    assert BackendType.RDMA not in mori_stand_in.control("a").backends

    status = pair.finish(pair.read())

    assert status.state is TransferState.FAILED
    assert "create_session returned None" in status.message
    assert "xgmi" in status.message


def test_unknown_backend_is_rejected(mori_stand_in: ModuleType) -> None:
    with pytest.raises(ValueError, match="'rdma' or 'xgmi'"):
        MoriTransferEngine("k", backend="tcp")


def test_missing_mori_gives_a_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mori.cpp", None)
    with pytest.raises(ImportError, match="mori IO is not importable"):
        MoriTransferEngine("k")


def test_regions_are_registered_by_address_with_the_device(pair: Pair) -> None:
    from mori.io import MemoryDesc, MemoryLocationType

    host = MemoryDesc.unpack(pair.a_region.descriptor)
    assert (host.data, host.size, host.device_id) == (pair.a_buf.ctypes.data, SIZE, -1)
    assert host.loc == MemoryLocationType.CPU
    assert host.engine_key == "a"
    gpu = pair.a.register_region(0x7F0000000000, 4096, MemoryKind.DEVICE, device_id=3)
    desc = MemoryDesc.unpack(gpu.descriptor)
    assert (desc.device_id, desc.loc) == (3, MemoryLocationType.GPU)


def test_metadata_is_the_packed_engine_descriptor(pair: Pair) -> None:
    from mori.io import EngineDesc

    assert EngineDesc.unpack(pair.a.metadata()).key == "a"
    assert pair.peer == "b"


def test_one_session_per_region_pair_is_cached(pair: Pair, mori_stand_in: ModuleType) -> None:
    control = mori_stand_in.control("a")
    for _ in range(3):
        assert pair.finish(pair.read()).state is TransferState.SUCCEEDED
    assert control.sessions_created == 1

    other = np.zeros(SIZE, np.uint8)
    other_region = pair.a.register_region(other.ctypes.data, SIZE)
    assert pair.finish(pair.read(local=other_region)).state is TransferState.SUCCEEDED
    assert control.sessions_created == 2
    np.testing.assert_array_equal(other, pair.b_buf)


def test_sessions_are_dropped_with_the_peer(pair: Pair, mori_stand_in: ModuleType) -> None:
    control = mori_stand_in.control("a")
    pair.finish(pair.read())
    pair.a.remove_peer(pair.peer)

    from mori.io import MemoryDesc

    raw_engine = mori_stand_in.find("a")
    local, remote = (MemoryDesc.unpack(r.descriptor) for r in (pair.a_region, pair.b_region))
    assert raw_engine.create_session(local, remote) is None, "remote engine must be deregistered"

    peer = pair.a.add_peer(pair.b.metadata())
    remote_region = pair.a.import_region(peer, pair.b_region.descriptor)
    assert pair.finish(pair.read(remote=remote_region)).state is TransferState.SUCCEEDED
    assert control.sessions_created == 2


def test_sessions_are_dropped_with_the_region(pair: Pair, mori_stand_in: ModuleType) -> None:
    pair.finish(pair.read())
    pair.a.deregister_region(pair.a_region)
    region = pair.a.register_region(pair.a_buf.ctypes.data, SIZE)
    assert pair.finish(pair.read(local=region)).state is TransferState.SUCCEEDED
    assert mori_stand_in.control("a").sessions_created == 2


def test_each_post_gets_its_own_transfer_uid(pair: Pair, mori_stand_in: ModuleType) -> None:
    for _ in range(3):
        pair.finish(pair.read())
    uids = [uid for _, uid, _, _ in mori_stand_in.control("a").posts]
    assert len(set(uids)) == 3


def test_sq_full_is_reported_at_once_as_backpressure(pair: Pair, mori_stand_in: ModuleType) -> None:
    control = mori_stand_in.control("a")
    control.polls_to_complete = 10**9  # an accepted post would stay in flight
    control.sq_full_burst = 1
    status = pair.a.poll(pair.read())
    assert status.state is TransferState.BACKPRESSURE
    assert "SQ full" in status.message
    assert not pair.a_buf.any()


def test_transport_failure_is_terminal_and_sticky(pair: Pair, mori_stand_in: ModuleType) -> None:
    mori_stand_in.control("a").fail_next = 1
    handle = pair.read()
    status = pair.finish(handle)
    assert status.state is TransferState.FAILED
    assert "ERR_RDMA_OP" in status.message
    assert "RETRY_EXC" in status.message
    assert pair.a.poll(handle) == status
    assert pair.finish(pair.read()).state is TransferState.SUCCEEDED


def test_releasing_an_in_flight_transfer_is_safe(pair: Pair, mori_stand_in: ModuleType) -> None:
    control = mori_stand_in.control("a")
    control.polls_to_complete = 3
    handle = pair.read()
    pair.a.release(handle)
    control.polls_to_complete = 0
    assert pair.finish(pair.read()).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)
