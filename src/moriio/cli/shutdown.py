"""Every process a tool starts stops with it: on SIGINT, SIGTERM and SIGHUP, and at exit.

The tools start each engine and router in a session of its own (so that stopping it reaches
the processes vLLM spawns), which also means a signal sent to the tool reaches none of them.
:func:`install` makes the tool forward it: each group's leader gets SIGTERM (a ``vllm serve`` server
then stops its own engine processes, as when it runs by hand), every group gets SIGKILL
after a grace period, and the tool exits with ``128 + signal``. A watchdog thread
SIGKILLs every group and ends the tool if that cleanup itself hangs. Every child also
carries ``MORIIO_TOOL_PID`` (the tool's pid) in its environment, inherited by whatever it
spawns, so leftovers can be found.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from types import FrameType

TOOL_PID_ENV = "MORIIO_TOOL_PID"
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 15.0  # SIGTERM to SIGKILL, as ManagedProcess.stop
WATCHDOG_S = 30.0  # after a signal, the tool ends by then whatever its cleanup does

_groups: dict[int, str] = {}  # live process groups (leader pid -> name)
_lock = threading.Lock()
_installed = False
_grace = GRACE_S


def track(pid: int, name: str) -> None:
    """A process group the tool started (its leader's pid)."""
    with _lock:
        _groups[pid] = name


def untrack(pid: int) -> None:
    with _lock:
        _groups.pop(pid, None)


def live_groups() -> dict[int, str]:
    with _lock:
        return dict(_groups)


def _signal_leaders(groups: dict[int, str], sig: signal.Signals) -> None:
    for pid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _signal_groups(groups: dict[int, str], sig: signal.Signals) -> None:
    for pid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_all(grace: float | None = None) -> None:
    """SIGTERM every live group's leader, SIGKILL what is left of the groups after ``grace``
    seconds (default: the one :func:`install` was given)."""
    grace = _grace if grace is None else grace
    groups = live_groups()
    if not groups:
        return
    _signal_leaders(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in groups):
        time.sleep(0.1)
    _signal_groups(groups, signal.SIGKILL)
    with _lock:
        for pid in groups:
            _groups.pop(pid, None)


def _watchdog(signum: int, limit: float) -> None:
    time.sleep(limit)
    _signal_groups(live_groups(), signal.SIGKILL)
    os._exit(128 + signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    for sig in SIGNALS:  # a second signal must not interrupt the cleanup
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_watchdog, args=(signum, WATCHDOG_S), daemon=True).start()
    stop_all()
    raise SystemExit(128 + signum)


def install(grace: float = GRACE_S) -> None:
    """Forward SIGINT, SIGTERM and SIGHUP to every process the tool started, and stop them
    at exit too. Call from the main thread, before starting processes."""
    global _installed, _grace
    _grace = grace
    os.environ[TOOL_PID_ENV] = str(os.getpid())
    if _installed:
        return
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)
    atexit.register(stop_all)
    _installed = True
