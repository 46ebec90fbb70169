"""mori adapter over the stand-in mori package, which behaves like mori's own source.

Covers configs, sessions, uids and statuses, and what real mori does that a kind fake would
hide: queue pairs that outlive a peer's restart or an error, ``create_session`` that blocks and
raises, SQ-full waits and partial posts, statuses written after a failure, bytes landing after
FAILED, backend creation without a NIC, environment overrides and the advertised host.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from moriio.adapters.mori import MoriTransferEngine
from moriio.ports import (
    MemoryKind,
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferState,
)
from support.mori_pair import SIZE, Pair, eventually, in_thread


def _finishes_while_blocked(work: Callable[[], object]) -> bool:
    """Whether ``work`` completes within 2 s on another thread."""
    thread = in_thread(work)
    thread.join(timeout=2)
    return not thread.is_alive()


@pytest.fixture
def pair(mori_stand_in: ModuleType) -> Pair:
    return Pair()


# -- construction ------------------------------------------------------------------------------


def test_conforms_to_the_port(mori_stand_in: ModuleType) -> None:
    engine: TransferEngine = MoriTransferEngine("k")
    assert engine.name.startswith("k@")


def test_engine_keys_are_unique_per_instance(mori_stand_in: ModuleType) -> None:
    first, second = MoriTransferEngine("same"), MoriTransferEngine("same")
    assert first.name != second.name
    assert {first.name.split("@")[0], second.name.split("@")[0]} == {"same"}


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

    engine = MoriTransferEngine(
        "k", host="10.0.0.7", port=7000, qp_per_transfer=4, post_batch_size=32
    )

    assert seen["IOEngineConfig"] == {"host": "10.0.0.7", "port": 7000}
    assert seen["RdmaBackendConfig"]["enable_notification"] is False
    assert seen["RdmaBackendConfig"]["qp_per_transfer"] == 4
    assert seen["RdmaBackendConfig"]["post_batch_size"] == 32
    backends = mori_stand_in.control(engine.name).backends
    assert list(backends) == [mori.io.BackendType.RDMA]
    assert backends[mori.io.BackendType.RDMA].poll_cq_mode == mori.io.PollCqMode.POLLING


@pytest.mark.parametrize("host", ["node-1.example", "::1", "", "0.0.0.0", "10.0.0.256"])
def test_advertised_host_must_be_a_dialable_ipv4_literal(
    mori_stand_in: ModuleType, host: str
) -> None:
    with pytest.raises(ValueError, match=r"IPv4|dial"):
        MoriTransferEngine("k", host=host)


def test_backend_without_a_nic_is_a_clear_engine_error(mori_stand_in: ModuleType) -> None:
    mori_stand_in.NIC_ACTIVE = False
    with pytest.raises(TransferEngineError, match=r"no active RDMA device.*backend='xgmi'"):
        MoriTransferEngine("k")


def test_environment_overrides_are_warned_about_and_honoured(
    mori_stand_in: ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MORI_IO_QP_PER_TRANSFER", "2")
    with caplog.at_level(logging.WARNING, logger="moriio.adapters.mori"):
        pair = Pair()
    assert "overrides the configured setting variable='MORI_IO_QP_PER_TRANSFER'" in caplog.text
    assert "effective=2 setting='qp_per_transfer' configured=1" in caplog.text
    # mori now splits a two-descriptor batch over two QPs: SQ full on the second chain
    # leaves the first posted, so the batch must not come back as re-postable.
    control = mori_stand_in.control(pair.a.name)
    control.sq_full_burst, control.sq_full_chain = 1, 1
    status = pair.finish(pair.read(pieces=2, gap=8))  # two work requests: two chains
    assert status.state is TransferState.FAILED
    assert "partly posted" in status.message


def test_the_start_up_log_says_what_mori_will_really_do(
    mori_stand_in: ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """mori's EVENT completion mode still spins (``epoll_wait`` with timeout 0), and a value
    mori ignores is not an override."""
    monkeypatch.setenv("MORI_IO_POLL_CQ_MODE", "event")
    monkeypatch.setenv("MORI_IO_QP_PER_TRANSFER", "0")
    with caplog.at_level(logging.INFO, logger="moriio.adapters.mori"):
        MoriTransferEngine("k")
    assert "EVENT mode also spins" in caplog.text
    assert "ignores an invalid value variable='MORI_IO_QP_PER_TRANSFER'" in caplog.text
    assert "overrides the configured setting variable='MORI_IO_QP_PER_TRANSFER'" not in caplog.text


def test_xgmi_option_and_its_missing_route_for_cpu_memory(mori_stand_in: ModuleType) -> None:
    from mori.io import BackendType

    pair = Pair(backend="xgmi", xgmi_num_streams=8, host="not-checked-for-xgmi")
    backends = mori_stand_in.control(pair.a.name).backends
    assert backends[BackendType.XGMI].num_streams == 8
    assert BackendType.RDMA not in backends

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


# -- regions, descriptors, sessions ------------------------------------------------------------


def test_regions_are_registered_by_address_with_the_device(pair: Pair) -> None:
    from mori.io import MemoryDesc, MemoryLocationType

    host = MemoryDesc.unpack(pair.a_region.descriptor)
    assert (host.data, host.size, host.device_id) == (pair.a_buf.ctypes.data, SIZE, -1)
    assert host.loc == MemoryLocationType.CPU
    assert host.engine_key == pair.a.name
    gpu = pair.a.register_region(0x7F0000000000, 4096, MemoryKind.DEVICE, device_id=3)
    desc = MemoryDesc.unpack(gpu.descriptor)
    assert (desc.device_id, desc.loc) == (3, MemoryLocationType.GPU)


def test_unmapped_host_memory_is_refused_before_mori_sees_it(pair: Pair) -> None:
    with pytest.raises(ValueError, match="not mapped"):
        pair.a.register_region(0x1000, 4096)  # the never-mapped first pages


def test_descriptors_are_read_only_msgpack_bytes(pair: Pair) -> None:
    from mori.io import EngineDesc

    desc = EngineDesc.unpack(pair.a.metadata())
    assert desc.key == pair.a.name
    assert pair.peer == pair.b.name
    with pytest.raises(AttributeError):
        desc.key = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        hash(desc)
    assert pair.a.add_peer(bytearray(pair.b.metadata())) == pair.peer  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="malformed"):
        pair.a.add_peer(b"\x93not-an-engine")


def test_sessions_are_built_when_the_region_is_imported(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    control = mori_stand_in.control(pair.a.name)
    built = control.sessions_created
    assert built == 1
    for _ in range(3):
        assert pair.finish(pair.read()).state is TransferState.SUCCEEDED
    assert control.sessions_created == built

    other = np.zeros(SIZE, np.uint8)
    other_region = pair.a.register_region(other.ctypes.data, SIZE)
    assert pair.finish(pair.read(local=other_region)).state is TransferState.SUCCEEDED
    assert control.sessions_created == built + 1
    np.testing.assert_array_equal(other, pair.b_buf)


def test_sessions_are_dropped_with_the_peer(pair: Pair, mori_stand_in: ModuleType) -> None:
    control = mori_stand_in.control(pair.a.name)
    pair.finish(pair.read())
    pair.a.remove_peer(pair.peer)

    from mori.io import MemoryDesc

    raw_engine = mori_stand_in.find(pair.a.name)
    local, remote = (MemoryDesc.unpack(r.descriptor) for r in (pair.a_region, pair.b_region))
    assert raw_engine.create_session(local, remote) is None, "remote engine must be deregistered"

    peer = pair.a.add_peer(pair.b.metadata())
    remote_region = pair.a.import_region(peer, pair.b_region.descriptor)
    assert pair.finish(pair.read(remote=remote_region)).state is TransferState.SUCCEEDED
    assert control.sessions_created == 2


def test_each_post_gets_its_own_transfer_uid(pair: Pair, mori_stand_in: ModuleType) -> None:
    for _ in range(3):
        pair.finish(pair.read())
    uids = [uid for _, uid, _, _ in mori_stand_in.control(pair.a.name).posts]
    assert len(set(uids)) == 3


# -- restart and broken connections ------------------------------------------------------------


def test_a_restarted_peer_is_reached_on_fresh_queue_pairs(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    assert pair.finish(pair.read()).state is TransferState.SUCCEEDED
    pair.restart_b(mori_stand_in)  # same name, region id 0 again

    status = pair.finish(pair.read())

    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)


def test_an_error_completion_rebuilds_the_connection(pair: Pair, mori_stand_in: ModuleType) -> None:
    mori_stand_in.control(pair.a.name).fail_next = 1  # its QP goes to ERROR
    handle = pair.read()
    failed = pair.finish(handle)
    assert failed.state is TransferState.FAILED
    assert "ERR_RDMA_OP" in failed.message
    assert "RETRY_EXC" in failed.message
    assert pair.a.poll(handle) == failed, "terminal failures are sticky"

    status = pair.finish(pair.read())

    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)


def test_a_dead_peer_fails_the_batches_that_wait_for_its_connection(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    doomed = MoriTransferEngine("doomed")
    buf = np.ones(SIZE, np.uint8)
    region = doomed.register_region(buf.ctypes.data, SIZE)
    peer = pair.a.add_peer(doomed.metadata())
    mori_stand_in.crash(doomed.name)
    remote = pair.a.import_region(peer, region.descriptor)  # the connection thread dials

    status = pair.finish(pair.read(remote=remote))

    assert status.state is TransferState.FAILED
    assert "Connection refused" in status.message


def test_a_failed_connection_is_a_failed_status_not_an_exception(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    mori_stand_in.crash(pair.b.name)
    lost = pair.finish(pair.read())
    assert "RETRY_EXC" in lost.message  # the QP is in ERROR: the next post reconnects

    status = pair.finish(pair.read())  # create_session raises inside mori

    assert status.state is TransferState.FAILED
    assert "Connection refused" in status.message
    again = pair.finish(pair.read())
    assert "next attempt in" in again.message, "a dead peer is not dialled on every post"


# -- nothing blocks under the adapter lock -----------------------------------------------------


def test_the_sq_full_back_off_does_not_stall_other_threads(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    done = pair.read()
    control = mori_stand_in.control(pair.a.name)
    control.sq_gate, control.sq_full_burst = threading.Event(), 1
    handles: list[TransferHandle] = []
    poster = in_thread(lambda: handles.append(pair.read()))
    try:
        assert _finishes_while_blocked(lambda: (pair.finish(done), pair.a.progress()))
        closer = in_thread(pair.a.close)
        closer.join(timeout=0.2)
        assert closer.is_alive(), "close must not destroy mori's engine under a running post"
    finally:
        control.sq_gate.set()
    poster.join(timeout=5)
    closer.join(timeout=5)
    assert not closer.is_alive()
    with pytest.raises(TransferEngineError, match="closed"):
        pair.a.poll(handles[0])


# -- SQ full, partial posts, status lifetime ---------------------------------------------------


def test_sq_full_on_one_chain_is_backpressure(pair: Pair, mori_stand_in: ModuleType) -> None:
    control = mori_stand_in.control(pair.a.name)
    control.hold = True  # an accepted post would stay in flight
    control.sq_full_burst = 1
    status = pair.a.poll(pair.read(pieces=4))
    assert status.state is TransferState.BACKPRESSURE
    assert "SQ full" in status.message
    assert not pair.a_buf.any()


def test_sq_full_after_a_partial_post_is_not_re_postable(mori_stand_in: ModuleType) -> None:
    pair = Pair(qp_per_transfer=2)
    control = mori_stand_in.control(pair.a.name)
    control.sq_full_burst, control.sq_full_chain = 1, 1

    status = pair.finish(pair.read(pieces=2, gap=8))

    assert status.state is TransferState.FAILED, "re-posting would duplicate the posted chain"
    assert "partly posted" in status.message
    assert len(control.posts) == 1


def test_a_failed_status_stays_alive_while_mori_may_write_it(mori_stand_in: ModuleType) -> None:
    pair = Pair(qp_per_transfer=2)
    control = mori_stand_in.control(pair.a.name)
    control.sq_full_burst, control.sq_full_chain = 1, 1
    control.fail_next = 1  # the chain that was posted completes with an error later
    handle = pair.read(pieces=2, gap=8)
    assert pair.finish(handle).state is TransferState.FAILED
    pair.a.release(handle)

    assert pair.finish(pair.read()).state is TransferState.SUCCEEDED  # drives completions
    assert control.dangling_writes == 0


# -- failed is not stopped ---------------------------------------------------------------------


def test_bytes_land_after_remove_peer_until_the_engine_says_quiet(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    control = mori_stand_in.control(pair.a.name)
    control.hold = True
    handle = pair.read()
    pair.a.remove_peer(pair.peer)
    status = pair.a.poll(handle)
    assert status.state is TransferState.FAILED
    assert "may still land" in status.message
    assert not pair.a.quiet(peer=pair.peer)
    assert not pair.a.quiet(region=pair.a_region)

    control.hold = False
    pair.a.release(handle)

    eventually(lambda: pair.a.quiet(peer=pair.peer), "the removed peer's batch went quiet")
    assert pair.a.quiet()
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)  # it landed after FAILED


def test_deregistering_a_busy_region_waits_for_its_transfers(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    control = mori_stand_in.control(pair.a.name)
    raw = mori_stand_in.find(pair.a.name)
    control.hold = True
    handle = pair.read()
    pair.a.deregister_region(pair.a_region)
    with pytest.raises(TransferEngineError, match="not registered"):
        pair.read()
    assert pair.a_region.region_id in raw.registered_ids(), "mori still needs the region"

    control.hold = False
    assert pair.finish(handle).state is TransferState.SUCCEEDED
    eventually(
        lambda: pair.a.quiet() and pair.a_region.region_id not in raw.registered_ids(),
        "the deregistered memory went back to mori",
    )

    other = np.zeros(SIZE, np.uint8)
    region = pair.a.register_region(other.ctypes.data, SIZE)
    assert pair.finish(pair.read(local=region)).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(other, pair.b_buf)


def test_releasing_an_in_flight_transfer_is_safe(pair: Pair, mori_stand_in: ModuleType) -> None:
    control = mori_stand_in.control(pair.a.name)
    control.polls_to_complete = 3
    handle = pair.read()
    pair.a.release(handle)
    control.polls_to_complete = 0
    assert pair.finish(pair.read()).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)
    assert control.dangling_writes == 0
