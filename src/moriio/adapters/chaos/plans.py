"""What the chaos wrappers may inject, and how often: validated, frozen fault plans."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields


class EngineFault(enum.StrEnum):
    """Faults a :class:`~moriio.adapters.chaos.ChaosTransferEngine` injects, by counter name."""

    BACKPRESSURE = "backpressure"  # a post reports BACKPRESSURE (bursts of consecutive posts)
    FAILED = "failed"  # a post fails terminally before any byte moves
    FAILED_IN_FLIGHT = "failed_in_flight"  # the batch runs, then reports FAILED anyway
    HUNG = "hung"  # the batch stays IN_PROGRESS forever (a lost completion)
    SLOW = "slow"  # the batch's completion is held back for extra polls
    LATE = "late"  # the batch's bytes land up to ``late_max`` seconds later (maybe after
    # its timeout: a late completion), unless it is cancelled or its peer removed first
    LOST_CANCEL = "lost_cancel"  # a cancel is lost: the batch runs on
    STUCK_AFTER_REMOVE = "stuck_after_remove"  # a removed peer's batch stays IN_PROGRESS
    RETIRED = "retired"  # a NIC fault retired the connections: every batch in flight fails
    # at once (its bytes may still land, up to ``late_max`` later) and the next post is
    # refused before anything is posted (BACKPRESSURE), as mori 1.2.4 retires an endpoint


class ChannelFault(enum.StrEnum):
    """Faults a :class:`~moriio.adapters.chaos.ChaosControlChannel` injects, by counter name."""

    DROPPED = "dropped"  # an inbound message (or a targeted outgoing one) is lost
    DUPLICATED = "duplicated"  # an inbound message is delivered twice
    REORDERED = "reordered"  # an inbound message is overtaken by later ones
    DELAYED = "delayed"  # an inbound message is held back for clock time
    REQUEST_DROPPED = "request_dropped"  # a request (handshake) gets no reply (or is targeted)
    REQUEST_DELAYED = "request_delayed"  # a request's reply comes late (maybe too late)


def _check_probabilities(owner: object, names: tuple[str, ...]) -> None:
    total = 0.0
    for name in names:
        value = getattr(owner, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{type(owner).__name__}.{name} must be a number, got {value!r}")
        if not 0.0 <= value <= 1.0:
            raise ValueError(
                f"{type(owner).__name__}.{name} is a probability in [0, 1], got {value!r}"
            )
        total += value
    if total > 1.0 + 1e-9:
        raise ValueError(
            f"{type(owner).__name__}: {' + '.join(names)} must not exceed 1, got {total:g}"
        )


def _check_count(owner: object, name: str, minimum: int) -> None:
    value = getattr(owner, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"{type(owner).__name__}.{name} must be an int >= {minimum}, got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class EngineFaultPlan:
    """Per-post probabilities of each engine fault (they are exclusive: their sum is <= 1).

    ``backpressure`` starts a burst: this post and up to ``burst_max - 1`` following posts
    report BACKPRESSURE. ``slow`` holds a batch's completion back for 1..``slow_polls``
    polls. ``late`` delays a batch's landing by 0..``late_max`` seconds of the wrapper's
    clock (one is needed then). Per event rather than per post: ``lost_cancel`` (a cancel
    does nothing) and ``stuck_after_remove`` (a batch to a removed peer reports IN_PROGRESS
    for ever; it moves no byte all the same). Every probability 0 (the default) injects
    nothing.
    """

    backpressure: float = 0.0
    burst_max: int = 4
    failed: float = 0.0
    failed_in_flight: float = 0.0
    hung: float = 0.0
    slow: float = 0.0
    slow_polls: int = 8
    late: float = 0.0
    late_max: float = 0.0
    lost_cancel: float = 0.0
    stuck_after_remove: float = 0.0

    def __post_init__(self) -> None:
        _check_probabilities(
            self, ("backpressure", "failed", "failed_in_flight", "hung", "slow", "late")
        )
        _check_probabilities(self, ("lost_cancel",))
        _check_probabilities(self, ("stuck_after_remove",))
        _check_count(self, "burst_max", 1)
        _check_count(self, "slow_polls", 1)
        late_max = self.late_max
        if isinstance(late_max, bool) or not isinstance(late_max, int | float):
            raise TypeError(f"EngineFaultPlan.late_max must be a number, got {late_max!r}")
        if not math.isfinite(late_max) or late_max < 0:
            raise ValueError(f"EngineFaultPlan.late_max must be >= 0 seconds, got {late_max!r}")

    @classmethod
    def moderate(cls) -> EngineFaultPlan:
        """Rare faults of every kind: the plan of the opt-in chaos mode."""
        return cls(backpressure=0.02, failed=0.005, failed_in_flight=0.005, hung=0.002, slow=0.05)

    @property
    def is_quiet(self) -> bool:
        """True when the plan injects nothing."""
        return not any(
            getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("burst_max", "slow_polls", "late_max")
        )


@dataclass(frozen=True, slots=True)
class ChannelFaultPlan:
    """Per-message probabilities of each channel fault.

    Inbound one-way messages are dropped (``drop``), or else delivered twice
    (``duplicate``), overtaken by later messages (``reorder``, held for 1..3 drains) or held
    back for a uniform 0..``delay_max`` seconds of clock time (``delay``); these four are
    exclusive. A request is lost with ``request_drop`` (the caller waits its whole timeout)
    or its reply delayed with ``request_delay`` (a delay reaching the timeout times out).
    """

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay: float = 0.0
    delay_max: float = 1.0
    request_drop: float = 0.0
    request_delay: float = 0.0
    max_held: int = 4096

    def __post_init__(self) -> None:
        _check_probabilities(self, ("drop", "duplicate", "reorder", "delay"))
        _check_probabilities(self, ("request_drop", "request_delay"))
        if not math.isfinite(self.delay_max) or self.delay_max < 0:
            raise ValueError(
                f"ChannelFaultPlan.delay_max must be >= 0 seconds, got {self.delay_max!r}"
            )
        _check_count(self, "max_held", 1)

    @classmethod
    def moderate(cls) -> ChannelFaultPlan:
        """Rare faults of every kind: the plan of the opt-in chaos mode."""
        return cls(
            drop=0.005,
            duplicate=0.01,
            reorder=0.02,
            delay=0.02,
            delay_max=2.0,
            request_drop=0.01,
            request_delay=0.02,
        )

    @property
    def is_quiet(self) -> bool:
        """True when the plan injects nothing."""
        return not (
            self.drop
            or self.duplicate
            or self.reorder
            or self.delay
            or self.request_drop
            or self.request_delay
        )
