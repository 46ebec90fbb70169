"""Timeouts and the retry schedule for transient backpressure.

Pure arithmetic on caller-supplied times (seconds of a monotonic clock, or of a wall clock
where a parameter is named ``wall_now``): nothing here reads the time. Every deadline and
lease check built from these timeouts is a method here, so that each sum has one owner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_CLOCK_SKEW_ALLOWANCE = 1.0  # seconds two hosts' wall clocks may disagree
MAX_CLOCK_SKEW_ALLOWANCE = 3600.0
DEFAULT_QUARANTINE_TIMEOUT = 30.0  # seconds a timed-out batch may stay unsettled
DEFAULT_LIVENESS_TIMEOUT = 5.0  # seconds a peer with live transfers may stay silent
MAX_LEASE_SECONDS = 86400.0  # a lease further ahead than this is refused as absurd
RC_TIMER_UNIT = 4.096e-6  # seconds: an RDMA queue pair's local ACK timeout is this * 2**exponent
RC_TIMER_SLACK = 4.0  # the InfiniBand spec lets a transport timer run up to 4x its nominal value
RC_SETTLE_MARGIN = 0.1  # seconds after the last retry for its error completion to be handled
STATUS_GRACE = 1.0  # seconds a transport may still touch a status after it reported it final


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be positive and finite, got {value!r}")


@dataclass(frozen=True, slots=True)
class TransferPolicy:
    """Deadlines and backoff for transfers.

    ``transfer_timeout``: from posting a transfer to its terminal state.
    ``defer_timeout``: how long work may wait for its peer (e.g. a producer's write waiting
    for the consumer's ``remote_blocks``, or blocks held for a consumer's ``release``).
    ``clock_skew_allowance``: how far two hosts' wall clocks may disagree; every lease (a
    wall-clock time minted on one host and checked on another) is shortened by it where it
    is checked and lengthened by it where the memory it fences is given back.
    ``quarantine_timeout``: how long a batch that timed out or failed may stay unsettled (its
    bytes may still land) before its peer is torn down; its blocks stay quarantined until then.
    ``liveness_timeout``: how long a peer with live transfers may leave liveness probes
    unanswered (or unsent) before those transfers are given up (see
    :mod:`moriio.domain.worker.liveness`), independent of the other timeouts; 0 sends no
    probe at all, leaving dead peers to those timeouts.
    Backpressure retries wait ``backoff_initial`` seconds, multiplied by ``backoff_factor``
    after each retry up to ``backoff_max``, and never past the transfer deadline.
    """

    transfer_timeout: float = 30.0
    defer_timeout: float = 60.0
    backoff_initial: float = 0.001
    backoff_max: float = 0.050
    backoff_factor: float = 2.0
    clock_skew_allowance: float = DEFAULT_CLOCK_SKEW_ALLOWANCE
    quarantine_timeout: float = DEFAULT_QUARANTINE_TIMEOUT
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT

    def __post_init__(self) -> None:
        for name in (
            "transfer_timeout",
            "defer_timeout",
            "backoff_initial",
            "backoff_max",
            "quarantine_timeout",
        ):
            _check_positive(name, getattr(self, name))
        liveness = self.liveness_timeout
        if liveness != 0:
            _check_positive("liveness_timeout", liveness)
        skew = self.clock_skew_allowance
        if isinstance(skew, bool) or not isinstance(skew, int | float):
            raise TypeError(f"clock_skew_allowance must be a number of seconds, got {skew!r}")
        if not 0 <= skew <= MAX_CLOCK_SKEW_ALLOWANCE:
            raise ValueError(
                f"clock_skew_allowance must be in [0, {MAX_CLOCK_SKEW_ALLOWANCE:g}] s, got {skew!r}"
            )
        _check_positive("backoff_factor", self.backoff_factor)
        if self.backoff_factor < 1:
            raise ValueError(f"backoff_factor must be >= 1, got {self.backoff_factor!r}")
        if self.backoff_initial > self.backoff_max:
            raise ValueError(
                f"backoff_initial ({self.backoff_initial!r}) must not exceed "
                f"backoff_max ({self.backoff_max!r})"
            )

    def transfer_deadline(self, now: float) -> float:
        """Deadline of a transfer posted at ``now``."""
        return now + self.transfer_timeout

    def write_fence(self, now: float) -> float:
        """Until when blocks announced at ``now`` may still be written without a verdict.

        The write-by lease (``defer_timeout``), the last write's in-flight time, its
        quarantine until the producer tears the connection down, and the skew allowance.
        """
        return (
            now
            + self.defer_timeout
            + self.transfer_timeout
            + self.quarantine_timeout
            + self.clock_skew_allowance
        )

    def defer_deadline(self, now: float) -> float:
        """Until when a WRITE producer's save begun at ``now`` waits for ``remote_blocks``."""
        return now + self.defer_timeout

    def lease_end(self, wall_now: float) -> float:
        """End of the lease on blocks a producer hands off at ``wall_now`` (its wall clock)."""
        return wall_now + self.defer_timeout

    def write_by(self, wall_now: float) -> float:
        """The write-by lease a consumer announces at ``wall_now``: no write is posted later."""
        return wall_now + self.defer_timeout

    @property
    def reclaim_after(self) -> float:
        """Seconds from a hand-off to its reclaim: the lease lengthened by the skew allowance."""
        return self.defer_timeout + self.clock_skew_allowance

    def reclaim_deadline(self, now: float) -> float:
        """When the scheduler reclaims blocks handed off at ``now`` (see :attr:`reclaim_after`)."""
        return now + (self.defer_timeout + self.clock_skew_allowance)

    def read_hold_deadline(self, now: float) -> float:
        """When a READ producer's worker drops blocks held at ``now``: one transfer past the
        scheduler's reclaim, so that the reclaim always comes first."""
        return now + self.defer_timeout + self.clock_skew_allowance + self.transfer_timeout

    def read_lease_too_short(self, expires: float, wall_now: float) -> bool:
        """Whether a READ started at ``wall_now`` could outlive a lease ending at ``expires``
        on another host's clock (the lease is shortened by the skew allowance)."""
        return wall_now + self.transfer_timeout + self.clock_skew_allowance > expires

    def write_by_passed(self, write_by: float, wall_now: float) -> bool:
        """Whether a write posted at ``wall_now`` could land after a write-by lease made on
        another host's clock (the lease is shortened by the skew allowance)."""
        return wall_now + self.clock_skew_allowance >= write_by

    def lease_absurd(self, expires: float, wall_now: float) -> bool:
        """Whether a lease ending at ``expires`` lies further ahead than any configuration
        makes one, seen at ``wall_now`` on another host's clock."""
        return expires > wall_now + self.clock_skew_allowance + MAX_LEASE_SECONDS

    def read_fits_lease(self) -> bool:
        """Whether a READ started as its hand-off's lease begins ends before the lease does
        on any host's clock (otherwise every READ is refused)."""
        return self.defer_timeout > self.transfer_timeout + self.clock_skew_allowance

    def quarantine_deadline(self, now: float) -> float:
        """When a batch left unsettled at ``now`` has its peer torn down."""
        return now + self.quarantine_timeout

    def retire_deadline(self, now: float) -> float:
        """Until when a worker going to sleep at ``now`` waits for the peers that hold its
        regions to confirm they no longer touch them: a live peer confirms once each of its
        batches with the worker ended, or stayed unsettled through its quarantine and had
        its connection torn down, plus the liveness bound for the notice to reach it."""
        return now + self.liveness_timeout + self.transfer_timeout + self.quarantine_timeout

    def liveness_silence(self, timeouts: float) -> float:
        """How long a peer may stay silent: ``timeouts`` liveness timeouts (0 with probes off:
        no bound)."""
        return self.liveness_timeout * timeouts

    @staticmethod
    def rc_settle_deadline(now: float, ack_timeout: int, retry_count: int) -> float:
        """When no byte of RDMA work left posted at ``now`` can land any more: its queue pair
        retries an unacknowledged request ``retry_count`` times, each after a local ACK
        timeout of ``RC_TIMER_UNIT * 2**ack_timeout`` (which may run ``RC_TIMER_SLACK``
        times longer), then fails it. ``ack_timeout`` 0 disables the timeout: never
        (``math.inf``), only destroying the queue pair stops the work."""
        if ack_timeout == 0:
            return math.inf
        nominal = RC_TIMER_UNIT * 2.0**ack_timeout * (retry_count + 1)
        return now + RC_TIMER_SLACK * nominal + RC_SETTLE_MARGIN

    @staticmethod
    def status_release_deadline(now: float) -> float:
        """Until when a status a transport reported final at ``now`` is kept: the transport's
        thread may still be inside the call that wrote it (mori stores the code, unlocks,
        then notifies the status's waiters)."""
        return now + STATUS_GRACE

    def backoff_delay(self, retries: int) -> float:
        """Wait before retry number ``retries + 1`` (``retries`` already made)."""
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if self.backoff_factor == 1:
            return self.backoff_initial
        # Compare exponents instead of computing factor**retries, which overflows.
        growth_needed = math.log(self.backoff_max / self.backoff_initial)
        if retries * math.log(self.backoff_factor) >= growth_needed:
            return self.backoff_max
        return min(self.backoff_initial * self.backoff_factor**retries, self.backoff_max)

    def backoff(self, posted_at: float) -> Backoff:
        """Retry state of a batch first posted at ``posted_at``."""
        return Backoff(policy=self, posted_at=posted_at)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry schedule of one posted batch that meets transient backpressure.

    Immutable: :meth:`retried` returns the state after one more re-post.
    """

    policy: TransferPolicy
    posted_at: float
    retries: int = 0

    @property
    def deadline(self) -> float:
        """No retry is due at or after this time: the transfer has failed by then."""
        return self.policy.transfer_deadline(self.posted_at)

    def next_attempt_at(self, now: float) -> float | None:
        """When to re-post after backpressure observed at ``now``; None when no retry fits.

        A retry is allowed only if it would be due strictly before the transfer deadline.
        """
        due = now + self.policy.backoff_delay(self.retries)
        return due if due < self.deadline else None

    def may_retry(self, now: float) -> bool:
        """Whether another retry is allowed after backpressure observed at ``now``."""
        return self.next_attempt_at(now) is not None

    def retried(self) -> Backoff:
        """The state after one more re-post (the next delay doubles, up to the maximum)."""
        return Backoff(policy=self.policy, posted_at=self.posted_at, retries=self.retries + 1)
