"""Finding what a tool left running: its descendants carry its pid in their environment."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from moriio.cli.shutdown import TOOL_PID_ENV


def tool_processes(tool_pid: int) -> list[int]:
    """Live processes whose environment says this tool started them (its descendants)."""
    marker = f"{TOOL_PID_ENV}={tool_pid}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == tool_pid:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if marker in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Whether ``predicate`` came true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
