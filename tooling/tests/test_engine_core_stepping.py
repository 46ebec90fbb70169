"""An engine process stepped as vLLM's engine core steps it (``EngineCore.run_busy_loop``):
stepped while the scheduler has requests, finished ones whose blocks a connector still holds
included; 1 ms after each step that ran no model; not at all, waiting on its connection,
once it has none. Driven here with a stand-in engine core over a real pipe."""

from __future__ import annotations

import os
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

import pytest

from moriio_tools.engines import engine_main
from moriio_tools.engines.protocol import EngineSpec, Shutdown


class _Scheduler:
    def __init__(self, core: _Core) -> None:
        self._core = core

    def has_requests(self) -> bool:
        return bool(self._core.script)


class _Core:
    """Runs the scripted steps: True ran the model, False only polled the connector; the
    last one has the orchestrator ask for a shutdown."""

    def __init__(self, script: list[bool], far: Connection) -> None:
        self.script = list(script)
        self.far = far
        self.batch_queue = None
        self.steps = 0
        self.step_fn = self._step

    def _step(self) -> tuple[dict[int, Any], bool]:
        self.steps += 1
        executed = self.script.pop(0)
        if not self.script:
            self.far.send(Shutdown())
        return {}, executed


class _LLMEngine:
    """``LLMEngine.step`` in-process: the core's ``step_fn``, its outputs processed."""

    def __init__(self, core: _Core) -> None:
        self.engine_core = type("InprocClient", (), {"engine_core": core})()

    def step(self) -> list[Any]:
        self.engine_core.engine_core.step_fn()
        return []


def _engine(core: _Core) -> Any:
    engine: Any = object.__new__(engine_main._Engine)
    engine.spec = EngineSpec(name="stand-in", kv_transfer_config=None, stepping="engine-core")
    engine.engine = _LLMEngine(core)
    engine.scheduler = _Scheduler(core)
    engine._started = set()
    engine._stopping = False
    engine._parent = os.getppid()
    return engine


def test_pending_transfers_keep_the_engine_stepped_with_the_cores_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[tuple[float, int]] = []
    near, far = Pipe()
    # Two forwards, then three steps that only poll a transfer (a prefill holding a
    # hand-off, a decode waiting for its KV), then a forward.
    core = _Core([True, True, False, False, False, True], far)
    monkeypatch.setattr(engine_main.time, "sleep", lambda s: slept.append((s, core.steps)))
    _engine(core).serve(near)
    assert core.steps == 6  # then nothing left: no step, it waited on its connection
    assert slept == [(0.001, 3), (0.001, 4), (0.001, 5)]


def test_an_engine_with_no_requests_is_not_stepped(monkeypatch: pytest.MonkeyPatch) -> None:
    near, far = Pipe()
    core = _Core([], far)
    far.send(Shutdown())
    monkeypatch.setattr(engine_main.time, "sleep", lambda s: pytest.fail("slept"))
    _engine(core).serve(near)
    assert core.steps == 0
