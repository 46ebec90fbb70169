"""Process-local 'network' of stand-in engines, plus the knobs and records tests use."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mori.io.engine import IOEngine

_ENGINES: weakref.WeakValueDictionary[str, IOEngine] = weakref.WeakValueDictionary()
_LISTENERS: weakref.WeakValueDictionary[int, IOEngine] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class Device:
    """The RDMA device every stand-in engine finds (``ibv_query_device`` / ``_port``)."""

    name: str = "mlx5_0"
    max_qp_wr: int = 32768  # the send queue cannot be deeper than this
    max_msg_sz: int = 2**31  # no work request may move more bytes than this
    max_sge: int = 4  # scatter/gather entries mori uses per work request (ionic: 2)


NIC_ACTIVE = True
"""False: ``create_backend(RDMA)`` fails as on a host without an active RDMA port."""
NIGHTLY = False
"""True: engines pack the 1.2.5 nightly's ``EngineDesc`` (an extra ``backendDescs`` field)."""
SETUP_GIL_SECONDS = 0.0
"""How long each set-up call (``IOEngine()``, ``create_backend``, ``register_memory``,
``create_session``) holds the interpreter lock, as mori's bindings do (no GIL release)."""
DEVICE = Device()
SETUP_CALLS: list[tuple[str, str]] = []
"""(set-up call, the thread that made it), for every engine: who paid for the held lock."""
PORT_UP = True
"""False after ``LOCAL_PORT_DOWN``: queue pairs built meanwhile never reach their peer."""


@dataclass
class Control:
    """Knobs and records of one stand-in engine."""

    polls_to_complete: int = 1  # completion-thread passes a posted WR waits before completing
    hold: bool = False  # while True no posted WR completes
    sq_full_burst: int = 0  # next N batch posts find a send queue full
    sq_full_chain: int = 0  # ... at this post chain (earlier chains are already posted)
    sq_gate: threading.Event | None = None  # an SQ-full post waits here (the SQ back-off)
    fail_next: int = 0  # next N posted WRs complete with an error (their QP goes to ERROR)
    fail_message: str = "transport retry counter exceeded (RETRY_EXC)"
    backends: dict[Any, Any] = field(default_factory=dict)  # BackendType -> effective config
    sessions_created: int = 0
    registered: list[tuple[int, int]] = field(default_factory=list)  # (data, size) per call
    deregistered: list[int] = field(default_factory=list)  # memory ids handed back
    qps_built: int = 0
    posts: list[tuple[str, int, int, int]] = field(default_factory=list)  # op, uid, n, bytes
    work_requests: list[int] = field(default_factory=list)  # merged WRs of each post
    dials: int = 0  # TCP connections to a peer's control plane
    notified: int = 0  # statuses notified after a completion stored their code
    dangling_writes: int = 0  # completions that found their TransferStatus already freed
    warnings: list[str] = field(default_factory=list)  # what mori would log as warnings


def attach(engine: IOEngine, port: int) -> None:
    key = engine.get_engine_desc().key
    if key in _ENGINES:
        raise RuntimeError(f"stand-in: an engine with key {key!r} already exists")
    _ENGINES[key] = engine
    _LISTENERS[port] = engine


def find(key: str) -> IOEngine | None:
    return _ENGINES.get(key)


def listener(port: int) -> IOEngine | None:
    """The engine whose control plane listens on ``port`` (what a TCP connect reaches)."""
    return _LISTENERS.get(port)


def alive(engine: IOEngine) -> bool:
    return _ENGINES.get(engine.get_engine_desc().key) is engine


def crash(key: str) -> None:
    """The engine's process 'dies': its memory and control plane vanish, peers keep their QPs."""
    engine = _ENGINES.pop(key, None)
    if engine is not None:
        _LISTENERS.pop(engine.get_engine_desc().port, None)


def control(key: str) -> Control:
    return _engine(key).stand_in


def fatal_event(key: str, reason: str, peer: str | None = None) -> None:
    """A fatal verbs async event: ``reason`` is a ``PeerFailureReason`` name.
    ``LOCAL_QP_ERROR`` retires engine ``key``'s queue pairs to ``peer``; ``LOCAL_PORT_DOWN``
    (and ``LOCAL_DEVICE_FATAL``) hits the one NIC every engine of the process uses: every
    queue pair is retired, and QPs built later are dead until :func:`port_up`. In-flight
    work on them fails, later posts on them are rejected, and each engine's
    ``pop_peer_failure()`` reports it (mori 1.2.4, ``MORI_IO_FAIL_ON_ASYNC_EVENT=1``)."""
    global PORT_UP
    if reason in ("LOCAL_PORT_DOWN", "LOCAL_DEVICE_FATAL"):
        PORT_UP = False
        for engine in list(_ENGINES.values()):
            engine.rdma.fatal_event(reason, None)
    else:
        _engine(key).rdma.fatal_event(reason, peer)


def port_up() -> None:
    """``IBV_EVENT_PORT_ACTIVE``: new queue pairs work again (retired ones stay retired)."""
    global PORT_UP
    PORT_UP = True


def degrade(key: str, peer: str, passes: int) -> None:
    """A partial ``ibv_post_send`` left orphaned WRs on the queue pairs to ``peer``: they
    reject new submissions for ``passes`` completion passes, then recover."""
    _engine(key).rdma.degrade(peer, passes)


def _engine(key: str) -> IOEngine:
    engine = _ENGINES.get(key)
    if engine is None:
        raise KeyError(f"stand-in: no live engine {key!r}")
    return engine


def reset() -> None:
    global NIC_ACTIVE, NIGHTLY, SETUP_GIL_SECONDS, DEVICE, PORT_UP
    for engine in list(_ENGINES.values()):
        engine.rdma.stop()
    _ENGINES.clear()
    _LISTENERS.clear()
    NIC_ACTIVE, NIGHTLY, SETUP_GIL_SECONDS, DEVICE, PORT_UP = True, False, 0.0, Device(), True
    SETUP_CALLS.clear()
