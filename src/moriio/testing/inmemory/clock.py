"""A fake Clock that only moves when told to, so timeout tests are deterministic and instant."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable


class FakeClock:
    """Monotonic time under test control: :meth:`advance` and :meth:`sleep` move it forward.

    ``on_sleep`` runs after every :meth:`sleep` has moved time (the simulation lets the other
    engine step there, as a sleeping process would). Every sleep is recorded in
    :attr:`sleeps` so tests can assert how a caller waited, unless ``record_sleeps`` is off
    (long simulations).
    """

    def __init__(
        self,
        start: float = 0.0,
        *,
        on_sleep: Callable[[], None] | None = None,
        record_sleeps: bool = True,
    ) -> None:
        if not math.isfinite(start):
            raise ValueError(f"start must be a finite number of seconds, got {start!r}")
        self._now = float(start)
        self._lock = threading.Lock()
        self._record = record_sleeps
        self.on_sleep = on_sleep
        self.sleeps: list[float] = []

    def now(self) -> float:
        """The current fake time in seconds."""
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` at once (nothing blocks), record it, then run ``on_sleep``."""
        self._check(seconds)
        with self._lock:
            if self._record:
                self.sleeps.append(float(seconds))
            self._now += seconds
        if self.on_sleep is not None:
            self.on_sleep()

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        self._check(seconds)
        with self._lock:
            self._now += seconds

    @staticmethod
    def _check(seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"time only moves forward by a finite amount, got {seconds!r}")
