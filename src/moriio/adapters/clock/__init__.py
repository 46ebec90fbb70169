"""Clock adapters: the process's monotonic and wall clocks behind the Clock port."""

from __future__ import annotations

import math
import time

__all__ = ["SystemClock", "SystemWallClock"]


class SystemClock:
    """Monotonic seconds from :func:`time.monotonic`; :meth:`sleep` really blocks."""

    def now(self) -> float:
        """Current monotonic time in seconds."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        if math.isnan(seconds) or seconds < 0:
            raise ValueError(f"cannot sleep a negative or NaN duration: {seconds!r}")
        time.sleep(seconds)


class SystemWallClock(SystemClock):
    """Wall-clock seconds since the epoch from :func:`time.time` (leases between hosts)."""

    def now(self) -> float:
        """Current wall-clock time in seconds."""
        return time.time()
