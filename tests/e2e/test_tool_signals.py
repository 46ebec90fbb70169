"""Stopping a tool mid-run (as ``timeout``, systemd, a container stop or a CI limit do) stops
every process it started: ``moriio demo`` on SIGTERM and ``moriio bench --e2e`` on SIGINT
once their ``vllm serve`` engines are up, ``moriio router`` on SIGHUP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from moriio.cli.shutdown import TOOL_PID_ENV
from moriio_tools.harness import free_ports, http_get
from support.tool_processes import tool_processes, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

ENGINES_UP_S = 300.0  # engines of a cold start on two shared cores
EXIT_S = 60.0  # the tool's own bound: SIGTERM grace 15 s, watchdog 30 s


def _moriio(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "moriio.cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k != TOOL_PID_ENV},
        )


def _stop_and_check(tool: subprocess.Popen[bytes], sig: signal.Signals, log: Path) -> None:
    try:
        tool.send_signal(sig)
        assert tool.wait(timeout=EXIT_S) == 128 + sig, log.read_text(errors="replace")[-2000:]
        left = tool_processes(tool.pid)
        assert wait_for(lambda: not tool_processes(tool.pid), 10.0), f"left running: {left}"
    finally:
        if tool.poll() is None:
            tool.kill()
        for pid in tool_processes(tool.pid):  # never leave the machine dirty
            os.kill(pid, signal.SIGKILL)


def _engines_up(tool: subprocess.Popen[bytes], count: int, log: Path) -> None:
    """At least ``count`` serving processes of the tool are up (an API server and its
    engine core per engine), and the tool is still running."""
    up = wait_for(
        lambda: tool.poll() is not None or len(tool_processes(tool.pid)) >= count,
        ENGINES_UP_S,
        interval=0.5,
    )
    assert up, log.read_text(errors="replace")[-2000:]
    assert tool.poll() is None, log.read_text(errors="replace")[-2000:]


def test_sigterm_to_the_demo_stops_its_router_and_engines(tmp_path: Path) -> None:
    log = tmp_path / "demo.out"
    tool = _moriio(
        "demo", "--mode", "read", "--requests", "4", "--idle-requests", "4",
        "--idle-gap", "10", "--log-dir", str(tmp_path / "logs"), log=log,
    )  # fmt: skip  # the idle phase lasts over 30 s: the signal lands inside it
    _engines_up(tool, 2, log)  # the baseline engine first
    wait_for(
        lambda: b"idle phase" in log.read_bytes() or tool.poll() is not None,
        ENGINES_UP_S,
        interval=0.5,
    )
    assert tool.poll() is None
    assert len(tool_processes(tool.pid)) >= 5  # the router, and the P and D engines
    _stop_and_check(tool, signal.SIGTERM, log)


def test_sigint_to_the_e2e_bench_stops_its_engines(tmp_path: Path) -> None:
    log = tmp_path / "bench.out"
    tool = _moriio(
        "bench", "--e2e", "--connectors", "moriio-read-async", "--cases", "short-1",
        "--requests", "2", "--rounds", "1", "--log-dir", str(tmp_path / "logs"), log=log,
    )  # fmt: skip
    _engines_up(tool, 2, log)
    _stop_and_check(tool, signal.SIGINT, log)


def test_sighup_ends_the_router(tmp_path: Path) -> None:
    port, ping = free_ports(2)
    log = tmp_path / "router.out"
    tool = _moriio("router", "--port", str(port), "--ping-port", str(ping), log=log)
    assert wait_for(lambda: http_get(f"http://127.0.0.1:{port}/instances")[0] == 200, 30.0)
    _stop_and_check(tool, signal.SIGHUP, log)
    assert http_get(f"http://127.0.0.1:{port}/instances")[0] == 0
