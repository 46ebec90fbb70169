"""Posting batches on a TransferEngine: backpressure retries, deadlines, completion polling.

One :class:`Poster` per worker. It owns every in-flight handle; services learn about
completions from :meth:`Poster.progress`. Driven from one thread.

Backpressure: a batch the engine refused for now (BACKPRESSURE, e.g. mori's "SQ full": the
RDMA send queue had no room for the post) is released and re-posted after a backoff, until
its deadline.

Quarantine: a batch that timed out, or failed while the engine cannot tell that its work
stopped, is reported failed at once but still counts in :meth:`Poster.inflight` until the
engine says it is settled (no byte of it can land any more). Services keep its memory until
then. A batch still unsettled ``quarantine_timeout`` after it ended gets its peer torn down.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from moriio.domain.kv.planner import TransferPlan
from moriio.domain.timing.policy import Backoff, TransferPolicy
from moriio.log import get_logger
from moriio.ports import (
    Clock,
    LocalRegion,
    PeerId,
    RemoteRegion,
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
)

log = get_logger("moriio.poster")


@dataclass(frozen=True, slots=True)
class PostRequest:
    """One batch of one transfer: a layer, or every layer in ``layers`` at once (between
    spans); ``layer`` names it in tags and messages."""

    transfer_id: str
    layer: str
    op: TransferOp
    local: LocalRegion
    remote: RemoteRegion
    plan: TransferPlan
    layers: tuple[str, ...] = ()

    @property
    def covered(self) -> tuple[str, ...]:
        """The layers whose bytes the batch moves."""
        return self.layers or (self.layer,)


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
    quarantined: int = 0  # batches kept after their end until the engine said settled
    late_completions: int = 0  # timed-out batches the engine reported terminal afterwards
    teardowns: int = 0  # peers torn down because a batch stayed unsettled
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


@dataclass(slots=True)
class _Quarantined:
    request: PostRequest
    handle: TransferHandle
    tear_down_at: float  # the peer is torn down then if the batch has not settled
    late: bool  # it timed out: the engine settling it later is a late completion
    torn_down: bool = False
    ended: bool = False  # polled terminal


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
        self._quarantine: dict[int, _Quarantined] = {}
        self._torn_down: list[PeerId] = []
        self._refusing: str | None = None  # why every post is refused now (a sleep)
        self.stats = PosterStats()

    def observe(self, observer: Callable[[Sequence[PostResult]], None]) -> None:
        """Also hand every non-empty list of results :meth:`progress` returns to ``observer``."""
        self._observers.append(observer)

    def inflight(self, transfer_id: str) -> int:
        """Batches of ``transfer_id`` not yet terminal, or ended but still quarantined."""
        return self._per_transfer.get(transfer_id, 0)

    def quarantined(self, transfer_id: str) -> int:
        """Batches of ``transfer_id`` that ended but whose bytes may still land."""
        return sum(1 for q in self._quarantine.values() if q.request.transfer_id == transfer_id)

    @property
    def num_inflight(self) -> int:
        return len(self._inflight) + len(self._quarantine)

    def refuse_posts(self, reason: str | None) -> None:
        """From now on refuse every post (new batches and re-posts alike, no byte of them
        moves) with ``reason``; None: post again."""
        self._refusing = reason

    def touches(self, peers: Collection[PeerId]) -> bool:
        """Whether a batch with one of ``peers`` is in flight or quarantined."""
        return any(e.request.remote.peer in peers for e in self._inflight.values()) or any(
            q.request.remote.peer in peers for q in self._quarantine.values()
        )

    def take_torn_down(self) -> list[PeerId]:
        """Peers torn down since the last call (their connections must be rebuilt)."""
        peers, self._torn_down = self._torn_down, []
        return peers

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
        for key, q in list(self._quarantine.items()):
            self._check_quarantined(key, q, now)
        done, self._done = self._done, []
        if done:
            for observer in self._observers:
                observer(done)
        return done

    def _post(self, key: int, entry: _InFlight) -> None:
        req = entry.request
        if self._refusing is not None:
            self.stats.refused += 1
            self._finish(key, entry, False, f"post refused: {self._refusing}")
            return
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
                self.stats.timed_out += 1
                self._engine.cancel(entry.handle)
                if self._engine.settled(entry.handle):  # cancelled: nothing more lands
                    self._engine.release(entry.handle)
                    entry.handle = None
                self._finish(key, entry, False, "transfer timed out", quarantine=True, late=True)
            return
        if state is TransferState.FAILED and not self._engine.settled(entry.handle):
            self._finish(key, entry, False, status.message or "transfer failed", quarantine=True)
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

    def _check_quarantined(self, key: int, q: _Quarantined, now: float) -> None:
        engine = self._engine
        if q.late and not q.torn_down and not q.ended:
            q.ended = engine.poll(q.handle).state.is_terminal  # drives a polled transport
        if not engine.settled(q.handle):
            if q.torn_down or now < q.tear_down_at:
                return  # after a teardown: the engine's own transport timeouts end it
            self._tear_down(q.request.remote.peer)
            if not engine.settled(q.handle):
                return
        elif q.late:
            self.stats.late_completions += 1  # the engine ended it after its timeout
        engine.release(q.handle)
        del self._quarantine[key]
        self._untrack(q.request.transfer_id)

    def abandon(self, peer: PeerId, reason: str) -> None:
        """``peer`` is gone or silent: end its batches now, failed (those posted stay
        quarantined until they settle), and tear its connection down."""
        for key, entry in list(self._inflight.items()):
            if entry.request.remote.peer != peer:
                continue
            if entry.handle is not None:
                self._engine.cancel(entry.handle)
            self._finish(key, entry, False, reason, quarantine=True, late=True)
        self._tear_down(peer)

    def _tear_down(self, peer: PeerId) -> None:
        """Remove ``peer`` from the engine, which ends its batches (at once, or once the
        transport ended what it had posted: their memory stays quarantined until then)."""
        self.stats.teardowns += 1
        with contextlib.suppress(TransferEngineError):  # closed or gone: nothing moves either
            self._engine.remove_peer(peer)
        waiting = []
        for q in self._quarantine.values():
            if q.request.remote.peer == peer:
                q.torn_down = True
                # Ended by the teardown itself: no completion of the engine's.
                q.late = q.late and not self._engine.settled(q.handle)
                if not self._engine.settled(q.handle):
                    waiting.append(q.request.transfer_id)
        log.warning(
            "peer torn down: a batch stayed unsettled through its quarantine",
            peer=str(peer),
            still_unsettled=sorted(set(waiting)),
        )
        self._torn_down.append(peer)

    def _finish(
        self,
        key: int,
        entry: _InFlight,
        ok: bool,
        message: str,
        *,
        quarantine: bool = False,
        late: bool = False,
    ) -> None:
        """Report the batch's end; with ``quarantine`` keep its handle until it settles
        (``late``: it timed out, so a terminal state seen later is a late completion)."""
        del self._inflight[key]
        if quarantine and entry.handle is not None:
            self.stats.quarantined += 1
            self._quarantine[key] = _Quarantined(
                entry.request,
                entry.handle,
                self._policy.quarantine_deadline(self._clock.now()),
                late=late,
            )
        else:
            self._untrack(entry.request.transfer_id)
        elapsed = self._clock.now() - entry.backoff.posted_at
        if ok:
            self.stats.succeeded += 1
        else:
            self.stats.failed += 1
        self.stats.transfer_seconds.append(elapsed)
        self._done.append(PostResult(entry.request, ok, message, entry.backoff.retries, elapsed))

    def _untrack(self, transfer_id: str) -> None:
        left = self._per_transfer[transfer_id] - 1
        if left:
            self._per_transfer[transfer_id] = left
        else:
            del self._per_transfer[transfer_id]
