"""Faults an in-memory channel applies to what it sends."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Faults applied to each message a channel sends.

    ``drop``: probability a message (or request) is lost. ``duplicate``: probability a
    delivered message arrives twice. ``reorder``: probability a message is inserted at a
    random place among the receiver's undrained messages instead of at the end. ``delay``:
    seconds of clock time before a message becomes drainable (needs a network clock); a
    request whose delay reaches its timeout times out.
    """

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay: float = 0.0

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"FaultPlan.{name} is a probability in [0, 1], got {value!r}")
        if not math.isfinite(self.delay) or self.delay < 0:
            raise ValueError(f"FaultPlan.delay must be >= 0 seconds, got {self.delay!r}")
