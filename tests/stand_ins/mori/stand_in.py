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

NIC_ACTIVE = True
"""False: ``create_backend(RDMA)`` fails as on a host without an active RDMA port."""


@dataclass
class Control:
    """Knobs and records of one stand-in engine."""

    polls_to_complete: int = 1  # completion-queue passes a posted WR waits before completing
    hold: bool = False  # while True no posted WR completes
    sq_full_burst: int = 0  # next N batch posts find a send queue full
    sq_full_chain: int = 0  # ... at this post chain (earlier chains are already posted)
    sq_gate: threading.Event | None = None  # an SQ-full post waits here (the SQ back-off)
    session_gate: threading.Event | None = None  # create_session waits here (TCP + QP exchange)
    fail_next: int = 0  # next N posted WRs complete with an error (their QP goes to ERROR)
    fail_message: str = "transport retry counter exceeded (RETRY_EXC)"
    backends: dict[Any, Any] = field(default_factory=dict)  # BackendType -> effective config
    sessions_created: int = 0
    registered: list[tuple[int, int]] = field(default_factory=list)  # (data, size) per call
    deregistered: list[int] = field(default_factory=list)  # memory ids handed back
    qps_built: int = 0
    posts: list[tuple[str, int, int, int]] = field(default_factory=list)  # op, uid, n, bytes
    dangling_writes: int = 0  # completions that found their TransferStatus already freed


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
    engine = _ENGINES.get(key)
    if engine is None:
        raise KeyError(f"stand-in: no live engine {key!r}")
    return engine.stand_in


def reset() -> None:
    global NIC_ACTIVE
    _ENGINES.clear()
    _LISTENERS.clear()
    NIC_ACTIVE = True
