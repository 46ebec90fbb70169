"""Posting batches on a TransferEngine: backpressure retries, deadlines, completion polling.

One :class:`Poster` per worker. It owns every in-flight handle; services learn about
completions from :meth:`Poster.progress`. Driven from one thread.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from moriio.domain.kv.planner import TransferPlan
from moriio.domain.timing.policy import Backoff, TransferPolicy
from moriio.ports import (
    Clock,
    LocalRegion,
    RemoteRegion,
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
)


@dataclass(frozen=True, slots=True)
class PostRequest:
    """One batch: a layer of one transfer."""

    transfer_id: str
    layer: str
    op: TransferOp
    local: LocalRegion
    remote: RemoteRegion
    plan: TransferPlan


@dataclass(frozen=True, slots=True)
class PostResult:
    """A batch reached a terminal state (``ok`` False: failed, refused or timed out)."""

    request: PostRequest
    ok: bool
    message: str
    retries: int
    elapsed: float  # seconds from first post to the terminal state


@dataclass(slots=True)
class PosterStats:
    posts: int = 0
    retries: int = 0
    backpressure_events: int = 0
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    refused: int = 0  # rejected by the engine before any byte moved
    bytes_moved: int = 0
    descriptors: int = 0
    transfer_seconds: list[float] = field(default_factory=list)  # per finished batch

    def take_transfer_seconds(self) -> tuple[float, ...]:
        """The batch durations recorded since the previous take."""
        taken, self.transfer_seconds = tuple(self.transfer_seconds), []
        return taken


@dataclass(slots=True)
class _InFlight:
    request: PostRequest
    handle: TransferHandle | None  # None while waiting to be re-posted
    backoff: Backoff
    retry_at: float = 0.0


class Poster:
    """Posts batches and turns engine states into :class:`PostResult` records."""

    def __init__(self, engine: TransferEngine, clock: Clock, policy: TransferPolicy) -> None:
        self._engine = engine
        self._clock = clock
        self._policy = policy
        self._inflight: dict[int, _InFlight] = {}
        self._retry_heap: list[tuple[float, int]] = []
        self._next_key = 0
        self._per_transfer: dict[str, int] = {}
        self._done: list[PostResult] = []
        self._observers: list[Callable[[Sequence[PostResult]], None]] = []
        self.stats = PosterStats()

    def observe(self, observer: Callable[[Sequence[PostResult]], None]) -> None:
        """Also hand every non-empty list of results :meth:`progress` returns to ``observer``."""
        self._observers.append(observer)

    def inflight(self, transfer_id: str) -> int:
        """Batches of ``transfer_id`` not yet terminal."""
        return self._per_transfer.get(transfer_id, 0)

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    def submit(self, request: PostRequest) -> None:
        """Post now; an empty plan succeeds at once."""
        now = self._clock.now()
        if request.plan.num_descriptors == 0:
            self._done.append(PostResult(request, True, "nothing to move", 0, 0.0))
            return
        key = self._next_key
        self._next_key += 1
        entry = _InFlight(request, None, self._policy.backoff(now))
        self._inflight[key] = entry
        self._per_transfer[request.transfer_id] = self._per_transfer.get(request.transfer_id, 0) + 1
        self._post(key, entry)

    def progress_engine(self) -> None:
        """Let the engine make progress (a polled transport moves only when driven)."""
        self._engine.progress()

    def progress(self) -> list[PostResult]:
        """Poll every in-flight batch once; re-post due retries; return what finished."""
        now = self._clock.now()
        heap = self._retry_heap
        while heap and heap[0][0] <= now:
            _, key = heapq.heappop(heap)
            entry = self._inflight.get(key)
            if entry is not None and entry.handle is None:
                self._post(key, entry)
        for key, entry in list(self._inflight.items()):
            if entry.handle is None:
                if now >= entry.backoff.deadline:
                    self._finish(key, entry, False, "backpressure persisted past the deadline")
                    self.stats.timed_out += 1
                continue
            self._check(key, entry, now)
        done, self._done = self._done, []
        if done:
            for observer in self._observers:
                observer(done)
        return done

    def _post(self, key: int, entry: _InFlight) -> None:
        req = entry.request
        try:
            entry.handle = self._engine.post(
                req.op,
                req.local,
                req.remote,
                req.plan.local_offsets,
                req.plan.remote_offsets,
                req.plan.sizes,
                f"{req.transfer_id}/{req.layer}",
            )
        except TransferEngineError as exc:
            self.stats.refused += 1
            self._finish(key, entry, False, f"post refused: {exc}")
            return
        self.stats.posts += 1
        self._check(key, entry, self._clock.now())

    def _check(self, key: int, entry: _InFlight, now: float) -> None:
        assert entry.handle is not None
        status = self._engine.poll(entry.handle)
        state = status.state
        if state is TransferState.IN_PROGRESS:
            if now >= entry.backoff.deadline:
                self._engine.release(entry.handle)
                self.stats.timed_out += 1
                self._finish(key, entry, False, "transfer timed out")
            return
        self._engine.release(entry.handle)
        entry.handle = None
        if state is TransferState.SUCCEEDED:
            self.stats.bytes_moved += entry.request.plan.total_bytes
            self.stats.descriptors += entry.request.plan.num_descriptors
            self._finish(key, entry, True, "")
        elif state is TransferState.BACKPRESSURE:
            self.stats.backpressure_events += 1
            due = entry.backoff.next_attempt_at(now)
            if due is None:
                self.stats.timed_out += 1
                self._finish(
                    key, entry, False, f"backpressure until the deadline: {status.message}"
                )
                return
            entry.backoff = entry.backoff.retried()
            entry.retry_at = due
            self.stats.retries += 1
            heapq.heappush(self._retry_heap, (due, key))
        else:
            self._finish(key, entry, False, status.message or "transfer failed")

    def _finish(self, key: int, entry: _InFlight, ok: bool, message: str) -> None:
        del self._inflight[key]
        tid = entry.request.transfer_id
        left = self._per_transfer[tid] - 1
        if left:
            self._per_transfer[tid] = left
        else:
            del self._per_transfer[tid]
        elapsed = self._clock.now() - entry.backoff.posted_at
        if ok:
            self.stats.succeeded += 1
        else:
            self.stats.failed += 1
        self.stats.transfer_seconds.append(elapsed)
        self._done.append(PostResult(entry.request, ok, message, entry.backoff.retries, elapsed))
