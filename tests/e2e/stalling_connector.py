"""The real moriio connector, in an engine whose interpreter a native call can hold.

In the scheduler's process a thread waits for the file named by ``MORIIO_TEST_STALL_FILE``;
each time it appears, the thread reads and removes it and calls libc ``sleep`` through ctypes
without releasing the GIL: every Python thread of the engine process stands still, as behind
a long native call of a model or a kernel launch. The file says ``<seconds> <beat>``:
``beat`` 1 freezes the router heartbeat's process for as long (SIGSTOP, SIGCONT), what a
heartbeat thread inside the engine would do (the negative control). It stamps
``<file>.started`` and ``<file>.ended`` around every stall.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from moriio.vllm_plugin import MoriioKVConnector

CLASS_NAME = "StallingMoriioKVConnector"
MODULE_PATH = __name__


class StallingMoriioKVConnector(MoriioKVConnector):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        trigger = os.environ.get("MORIIO_TEST_STALL_FILE")
        if self.scheduler_side is not None and trigger:
            beat = self.heartbeat
            beat_pid = None if beat is None else beat.pid
            threading.Thread(
                target=_stall_on, args=(Path(trigger), beat_pid), name="stall", daemon=True
            ).start()


def _stall_on(trigger: Path, beat_pid: int | None) -> None:
    hold = ctypes.PyDLL(None).sleep  # PyDLL: the GIL stays held during the call
    while True:
        if trigger.exists():
            seconds, beat = (int(word) for word in trigger.read_text().split())
            trigger.unlink()
            frozen = beat_pid if beat == 1 else None
            _stamp(Path(f"{trigger}.started"))
            if frozen is not None:
                os.kill(frozen, signal.SIGSTOP)
            hold(seconds)
            if frozen is not None:
                os.kill(frozen, signal.SIGCONT)
            _stamp(Path(f"{trigger}.ended"))
        time.sleep(0.05)


def _stamp(path: Path) -> None:
    """Write the time into ``path`` at once: a reader never sees the file empty."""
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(str(time.time()))
    os.replace(staging, path)
