"""No engine stall on set-up: mori's set-up calls hold the interpreter lock, so none of them
runs on a thread that imports a peer's regions (a handshake applied by the worker) or posts
(the forward): they run on the adapter's connection thread.

In amd-mori 1.2.4 only the read/write/batch calls, ``AllocateTransferUniqueId``,
``PopInbound``, ``WaitAll``, ``PopPeerFailure`` and the waits release the GIL
(``src/pybind/pybind_io.cpp``); ``CreateSession``, ``RegisterMemory``, ``CreateBackend`` and
the constructor hold it. The stand-in holds it as well (``stand_in.SETUP_GIL_SECONDS``) and
records which thread made each set-up call. How long an engine step waits meanwhile is
measured by ``benchmarks/bench_mori_setup.py`` (not asserted here).
"""

from __future__ import annotations

import ctypes
import threading
from types import ModuleType

import numpy as np
import pytest

from moriio.adapters.mori import MoriTransferEngine
from moriio.ports import TransferState
from support.mori_pair import SIZE, WAIT, Pair, eventually, finish

CONNECT = "moriio-mori-connect"


def _setup_threads(stand_in: ModuleType, *calls: str) -> list[str]:
    return [thread for call, thread in stand_in.SETUP_CALLS if call in calls]


def test_the_stand_in_holds_the_interpreter_lock_in_set_up_calls(
    mori_stand_in: ModuleType,
) -> None:
    """Each set-up call blocks in a ``ctypes.PyDLL`` function: ctypes keeps the GIL for those
    (a ``CDLL`` call, or ``time.sleep``, would release it, as mori's bindings do not)."""
    from mori.io import IOEngine, IOEngineConfig, MemoryLocationType, gil

    assert isinstance(gil._LIBC, ctypes.PyDLL)
    engine = IOEngine("e", IOEngineConfig(host="127.0.0.1", port=0))
    engine.create_backend(mori_stand_in_backend())
    engine.register_memory(0x1000, 64, -1, MemoryLocationType.CPU)
    assert [call for call, _ in mori_stand_in.SETUP_CALLS] == [
        "IOEngine",
        "CreateBackend",
        "RegisterMemory",
    ]


def mori_stand_in_backend() -> object:
    from mori.io import BackendType

    return BackendType.RDMA


def test_import_region_leaves_the_sessions_to_the_connection_thread(
    mori_stand_in: ModuleType,
) -> None:
    mori_stand_in.SETUP_GIL_SECONDS = 0.01
    a, b = MoriTransferEngine("a"), MoriTransferEngine("b")
    buf, mine = np.arange(SIZE, dtype=np.uint8), np.zeros(SIZE, np.uint8)
    a.register_region(mine.ctypes.data, SIZE)  # KV registration: at start-up, before serving
    b_region = b.register_region(buf.ctypes.data, SIZE)
    peer = a.add_peer(b.metadata())
    del mori_stand_in.SETUP_CALLS[:]

    a.import_region(peer, b_region.descriptor)  # the handshake is applied here

    assert a.wait_for_connections(WAIT)
    threads = _setup_threads(mori_stand_in, "CreateSession", "RegisterMemory", "IOEngine")
    assert threads
    assert all(t.startswith(CONNECT) for t in threads), threads


def test_posts_never_build_a_session_a_memory_or_a_connection(mori_stand_in: ModuleType) -> None:
    """Memory registered after the handshake, and a connection that broke: both need mori
    set-up calls (a session; a new engine, its backend, its registrations), and both run on
    the connection thread while the posting thread carries on."""
    pair = Pair()
    mori_stand_in.SETUP_GIL_SECONDS = 0.005
    late = np.zeros(SIZE, np.uint8)
    late_region = pair.a.register_region(late.ctypes.data, SIZE)
    mori_stand_in.control(pair.a.name).fail_next = 1  # the next QP goes to ERROR
    broken = pair.finish(pair.read())
    assert broken.state is TransferState.FAILED
    del mori_stand_in.SETUP_CALLS[:]

    first = pair.read(local=late_region)
    second = pair.read()

    assert pair.finish(first).state is TransferState.SUCCEEDED
    assert pair.finish(second).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(late, pair.b_buf)
    calls = {call for call, _ in mori_stand_in.SETUP_CALLS}
    assert {"IOEngine", "CreateBackend", "RegisterMemory", "CreateSession"} <= calls
    threads = [thread for _, thread in mori_stand_in.SETUP_CALLS]
    assert all(t.startswith(CONNECT) for t in threads), threads


def test_a_batch_waits_for_its_connection_and_is_not_quiet_meanwhile(
    mori_stand_in: ModuleType,
) -> None:
    """Posted before its session exists, a batch is IN_PROGRESS and not settled (it will be
    posted); cancelled before it was posted, it is settled at once."""
    mori_stand_in.SETUP_GIL_SECONDS = 0.05
    a, b = MoriTransferEngine("a"), MoriTransferEngine("b")
    a_buf, b_buf = np.zeros(SIZE, np.uint8), np.ones(SIZE, np.uint8)
    a_region = a.register_region(a_buf.ctypes.data, SIZE)
    remote = a.import_region(
        a.add_peer(b.metadata()), b.register_region(b_buf.ctypes.data, SIZE).descriptor
    )
    zero, size = np.zeros(1, np.int64), np.array([SIZE], np.int64)
    from moriio.ports import TransferOp

    waits = a.post(TransferOp.READ, a_region, remote, zero, zero, size, "w")
    dropped = a.post(TransferOp.READ, a_region, remote, zero, zero, size, "d")
    assert a.poll(waits).state is TransferState.IN_PROGRESS
    assert not a.settled(waits)
    a.cancel(dropped)
    assert a.settled(dropped)
    assert "before it was posted" in a.poll(dropped).message

    assert finish(a, waits).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(a_buf, b_buf)


@pytest.mark.parametrize("remove_first", [False, True])
def test_close_and_remove_peer_end_the_batches_that_wait(
    mori_stand_in: ModuleType, remove_first: bool
) -> None:
    pair = Pair()
    mori_stand_in.SETUP_GIL_SECONDS = 0.02
    mori_stand_in.control(pair.a.name).fail_next = 1
    assert pair.finish(pair.read()).state is TransferState.FAILED
    handle = pair.read()  # waits for the rebuilt connection
    if remove_first:
        pair.a.remove_peer(pair.peer)
        assert pair.a.poll(handle).state is TransferState.FAILED
        assert pair.a.settled(handle)
    pair.a.close()
    eventually(
        lambda: not any(pair.a.name in t.name and t.is_alive() for t in threading.enumerate()),
        "the connection thread ended with the engine",
    )
