"""Opt-in per-request timelines: where a disaggregated request spends its time.

With ``MORIIO_TIMELINE_DIR`` set, every process that records (``moriio router``, each
engine's connector on its scheduler and worker sides) appends one JSON line per event to its
own file in that directory::

    {"t": 1764720000.123456, "ev": "decode.posted", "id": "<transfer id>"}

``t`` is the wall clock (``time.time()``), so files of processes on one host (or on hosts
whose clocks agree) join on ``id``, the transfer id both legs of a request share. Unset,
recording costs one attribute check. ``moriio bench --e2e --explain`` reads the files.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TIMELINE_DIR_ENV = "MORIIO_TIMELINE_DIR"


class Timeline:
    """Appends events to ``<directory>/<name>-<pid>.jsonl``; records nothing without a
    directory. Thread-safe: one line per event, written whole."""

    def __init__(self, directory: str | None, name: str) -> None:
        self._file: IO[str] | None = None
        self._lock = threading.Lock()
        if directory:
            path = Path(directory) / f"{name}-{os.getpid()}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", buffering=1, encoding="utf-8")

    @classmethod
    def from_env(cls, name: str) -> Timeline:
        return cls(os.environ.get(TIMELINE_DIR_ENV) or None, name)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def record(self, event: str, transfer_id: str, **fields: str | int | float) -> None:
        """One event of ``transfer_id``, stamped now."""
        if self._file is None:
            return
        line = json.dumps({"t": time.time(), "ev": event, "id": transfer_id, **fields})
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_events(directory: Path) -> Iterator[dict[str, Any]]:
    """Every event recorded in ``directory`` (lines that do not parse are skipped: a process
    killed mid-write leaves at most one)."""
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and {"t", "ev", "id"} <= event.keys():
                yield event
