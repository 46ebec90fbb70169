"""An engine process's handle: launch, dial-back with the spec, failures reported with the
process's log, the process reaped. The engine fails before vLLM is imported (a core this
machine lacks), so no engine is built."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moriio_tools.engines.engine_process import EngineError, EngineProcess
from moriio_tools.engines.protocol import EngineSpec

MISSING_CORE = 4096


def test_an_engine_that_fails_at_start_is_reported_with_its_log_and_reaped(
    tmp_path: Path,
) -> None:
    log = tmp_path / "engines" / "broken.log"  # its folder is created
    engine = EngineProcess(
        EngineSpec(name="broken", kv_transfer_config=None, log_path=str(log), cores=(MISSING_CORE,))
    )
    with pytest.raises(EngineError) as caught:
        engine.start(timeout_s=60.0)
    message = str(caught.value)
    assert message.startswith("engine broken failed:")
    assert "sched_setaffinity" in message  # the traceback the process sent
    assert f"--- end of {log} ---" in message  # and its log's tail
    engine.join(timeout_s=10.0)
    assert engine.exitcode == 1
    assert not engine.alive


def test_waiting_for_an_engine_never_launched_is_refused() -> None:
    engine = EngineProcess(EngineSpec(name="idle", kv_transfer_config=None))
    with pytest.raises(EngineError, match="engine idle was not launched"):
        engine.wait_ready(timeout_s=1.0)


def test_an_engine_killed_before_it_dials_back_is_reported(tmp_path: Path) -> None:
    env = {**EngineSpec(name="x", kv_transfer_config=None).env, "PYTHONPATH": str(tmp_path)}
    (tmp_path / "moriio_tools").mkdir()  # shadows the tooling: the process cannot start
    (tmp_path / "moriio_tools" / "__init__.py").write_text("raise SystemExit(3)\n")
    engine = EngineProcess(
        EngineSpec(name="shadowed", kv_transfer_config=None, env=env, log_path=os.devnull)
    )
    with pytest.raises(EngineError, match=r"engine shadowed did not dial back .* \(it exited\)"):
        engine.start(timeout_s=30.0)
    engine.join(timeout_s=5.0)
    assert engine.exitcode == 3
