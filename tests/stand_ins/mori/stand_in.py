"""Process-local 'network' of stand-in engines, plus the knobs and records tests use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mori.io.engine import IOEngine

_ENGINES: dict[str, IOEngine] = {}


@dataclass
class Control:
    """Knobs and records of one stand-in engine."""

    polls_to_complete: int = 1  # Code() calls that report IN_PROGRESS before completion
    sq_full_burst: int = 0  # next N batch posts fail synchronously with "SQ full"
    fail_next: int = 0  # next N posts fail at completion (sticky)
    fail_code: int = 13  # ERR_RDMA_OP
    fail_message: str = "ibv_wc_status: transport retry counter exceeded (RETRY_EXC)"
    backends: dict[Any, Any] = field(default_factory=dict)  # BackendType -> config
    sessions_created: int = 0
    posts: list[tuple[str, int, int, int]] = field(default_factory=list)  # op, uid, n, bytes


def attach(engine: IOEngine) -> None:
    key = engine.get_engine_desc().key
    if key in _ENGINES:
        raise RuntimeError(f"stand-in: an engine with key {key!r} already exists")
    _ENGINES[key] = engine


def find(key: str) -> IOEngine | None:
    return _ENGINES.get(key)


def crash(key: str) -> None:
    """The engine's process 'dies': peers' transfers to it fail from now on."""
    _ENGINES.pop(key, None)


def control(key: str) -> Control:
    engine = _ENGINES.get(key)
    if engine is None:
        raise KeyError(f"stand-in: no live engine {key!r}")
    return engine.stand_in


def reset() -> None:
    _ENGINES.clear()
