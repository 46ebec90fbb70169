"""Per-transfer spans from a worker's batch results, with statistics.

The connector's ``KVConnectorStats`` report per-batch (per-layer) durations; a request's
transfer latency is the span from its first batch posted to its last batch seen terminal.
:class:`SpanRecorder` observes one worker's batch results
(:meth:`~moriio.domain.worker.service.WorkerService.observe_batches`) to collect exactly that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from moriio.domain.worker.poster import PostResult
from moriio.ports import Clock
from moriio_tools.engines.protocol import TransferSpan


@dataclass(slots=True)
class _Open:
    start: float
    end: float
    bytes: int = 0
    batches: int = 0
    ok: bool = True


class SpanRecorder:
    """Observes every batch result the poster hands to the worker service."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._spans: dict[str, _Open] = {}

    def observe(self, results: Sequence[PostResult]) -> None:
        """Record results as they are reported (now is when they were seen terminal)."""
        self.record(results, self._clock.now())

    def record(self, results: Iterable[PostResult], now: float) -> None:
        for result in results:
            tid = result.request.transfer_id
            start = now - result.elapsed
            span = self._spans.get(tid)
            if span is None:
                span = self._spans[tid] = _Open(start, now)
            span.start = min(span.start, start)
            span.end = max(span.end, now)
            span.batches += 1
            span.ok = span.ok and result.ok
            if result.ok:
                span.bytes += result.request.plan.total_bytes

    def spans(self) -> tuple[TransferSpan, ...]:
        return tuple(
            TransferSpan(tid, s.start, s.end, s.bytes, s.batches, s.ok)
            for tid, s in self._spans.items()
        )


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 100]); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[min(len(ordered), int(rank)) - 1]


def busy_seconds(spans: Iterable[TransferSpan]) -> float:
    """Length of the union of the spans' intervals (time with any transfer in flight)."""
    total = 0.0
    cur_start: float | None = None
    cur_end = 0.0
    for span in sorted(spans, key=lambda s: s.start):
        if cur_start is None or span.start > cur_end:
            if cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = span.start, span.end
        else:
            cur_end = max(cur_end, span.end)
    if cur_start is not None:
        total += cur_end - cur_start
    return total
