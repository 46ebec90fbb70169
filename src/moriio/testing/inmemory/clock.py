"""A fake Clock that only moves when told to, so timeout tests are deterministic and instant."""

from __future__ import annotations

import math
import threading


class FakeClock:
    """Monotonic time under test control: :meth:`advance` and :meth:`sleep` move it forward.

    Every :meth:`sleep` is recorded in :attr:`sleeps` so tests can assert how a caller waited.
    """

    def __init__(self, start: float = 0.0) -> None:
        if not math.isfinite(start):
            raise ValueError(f"start must be a finite number of seconds, got {start!r}")
        self._now = float(start)
        self._lock = threading.Lock()
        self.sleeps: list[float] = []

    def now(self) -> float:
        """The current fake time in seconds."""
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` at once (nothing blocks) and record the call."""
        self._check(seconds)
        with self._lock:
            self.sleeps.append(float(seconds))
            self._now += seconds

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        self._check(seconds)
        with self._lock:
            self._now += seconds

    @staticmethod
    def _check(seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"time only moves forward by a finite amount, got {seconds!r}")
