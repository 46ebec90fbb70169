"""Clock adapter: the process's monotonic clock behind the Clock port."""

from __future__ import annotations

import math
import time

__all__ = ["SystemClock"]


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
