"""What the soak records: per interval, per engine at its quiet end, and per kill."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One engine at an interval's quiet end. ``incarnation`` counts its restarts, ``up_s``
    is the soak time since it (re)started; ``moriio`` holds the connector's counters the
    engine's ``/metrics`` exposes."""

    engine: str  # "prefill0", "decode0"
    incarnation: int
    up_s: float
    held_blocks: int
    requests: int  # running + waiting in the engine (0 when quiet)
    rss_mib: float  # summed over the server and every process of its session
    fds: int  # open descriptors, summed likewise
    processes: int
    moriio: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Interval:
    """Requests whose step ended in the interval, and every engine at its quiet end.

    ``errors`` are requests that failed outside a kill; ``kill_errors`` failed in flight
    while an engine was killed (allowed). ``answered - equal`` answers differed from the
    reference. ``t_s`` is the soak clock at the quiet end; ``quiet_s`` the wait for it."""

    index: int
    mode: str
    t_s: float
    sent: int
    answered: int
    equal: int
    errors: int
    kill_errors: int
    cancelled: int
    quiet_s: float
    engines: tuple[EngineSample, ...]
    error_examples: tuple[str, ...] = ()

    @property
    def mismatches(self) -> int:
        return self.answered - self.equal


@dataclass(frozen=True, slots=True)
class Kill:
    """One engine SIGKILLed with ``in_flight`` requests sent, then restarted on its ports;
    ``recovery`` pool requests followed the restart, ``recovery_equal`` answered equal; the
    decode's prompt tokens of those requests per source (vLLM's prefill stats) in
    ``recovery_sources``, out of ``recovery_prompt_tokens``."""

    mode: str
    engine: str
    role: str
    t_s: float  # soak clock at the kill
    in_flight: int
    answered: int
    errors: int
    restart_s: float
    recovery: int
    recovery_equal: int
    recovery_prompt_tokens: int
    recovery_sources: dict[str, int]


@dataclass(frozen=True, slots=True)
class Slope:
    """Least-squares slopes per hour of one engine incarnation's series (its warm-up left
    out). ``judged``: enough samples for the thresholds to apply."""

    mode: str
    engine: str
    incarnation: int
    samples: int
    span_s: float
    rss_mib_per_h: float | None
    fds_per_h: float | None
    held_blocks_per_h: float | None
    judged: bool
