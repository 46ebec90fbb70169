"""A worker's statistics as one frozen value: what stats reporters and tools read."""

from __future__ import annotations

from dataclasses import dataclass, fields

from moriio.domain.worker.context import WorkerContext


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Counts since the worker started, and duration samples (see :func:`worker_stats`)."""

    transfers_started: int = 0
    transfers_succeeded: int = 0
    transfers_failed: int = 0
    transfers_expired: int = 0
    # Batches (one layer of one transfer) as the poster saw them.
    bytes_moved: int = 0
    descriptors: int = 0
    posts: int = 0
    retries: int = 0
    backpressure_events: int = 0
    batches_succeeded: int = 0
    batches_failed: int = 0
    batches_timed_out: int = 0
    batches_refused: int = 0
    batches_quarantined: int = 0  # kept after their end until the engine said settled
    lease_refusals: int = 0
    messages_refused: int = 0
    messages_ignored: int = 0
    releases_refused: int = 0
    verdicts_refused: int = 0
    announcements_refused: int = 0
    handoffs_refused: int = 0  # unsigned, forged or another prompt's hand-offs (see docs)
    early_blocks_evicted: int = 0
    late_announcements: int = 0
    quarantined_blocks: int = 0
    late_completions: int = 0
    peer_teardowns: int = 0  # peers torn down because a batch never settled
    handshakes: int = 0
    handshake_failures: int = 0
    handshakes_rejected: int = 0  # peers' handshake requests this worker refused
    peer_restarts: int = 0
    failures_by_kind: tuple[tuple[str, int], ...] = ()  # sorted by kind
    transfer_seconds: tuple[float, ...] = ()  # per finished batch, posting to completion
    load_seconds: tuple[float, ...] = ()  # per load, order to KV landed

    def counts(self) -> dict[str, int]:
        """Every counter by field name (failures by kind and duration samples left out)."""
        return {f.name: v for f in fields(self) if isinstance(v := getattr(self, f.name), int)}


def worker_stats(ctx: WorkerContext, *, take_samples: bool) -> WorkerStats:
    """The worker's counters now; with ``take_samples``, also the duration samples recorded
    since the previous take, each of which is in exactly one result (memory stays bounded).
    """
    c, p, peers = ctx.counters, ctx.poster.stats, ctx.peers
    transfer_seconds: tuple[float, ...] = ()
    load_seconds: tuple[float, ...] = ()
    if take_samples:
        transfer_seconds = p.take_transfer_seconds()
        load_seconds = c.take_load_seconds()
    return WorkerStats(
        transfers_started=c.transfers_started,
        transfers_succeeded=c.transfers_succeeded,
        transfers_failed=c.transfers_failed,
        transfers_expired=c.transfers_expired,
        bytes_moved=p.bytes_moved,
        descriptors=p.descriptors,
        posts=p.posts,
        retries=p.retries,
        backpressure_events=p.backpressure_events,
        batches_succeeded=p.succeeded,
        batches_failed=p.failed,
        batches_timed_out=p.timed_out,
        batches_refused=p.refused,
        batches_quarantined=p.quarantined,
        lease_refusals=c.lease_refusals,
        messages_refused=c.messages_refused,
        messages_ignored=c.messages_ignored,
        releases_refused=c.releases_refused,
        verdicts_refused=c.verdicts_refused,
        announcements_refused=c.announcements_refused,
        handoffs_refused=c.handoffs_refused,
        early_blocks_evicted=c.early_blocks_evicted,
        late_announcements=c.late_announcements,
        quarantined_blocks=c.quarantined_blocks,
        late_completions=c.late_completions + p.late_completions,
        peer_teardowns=p.teardowns,
        handshakes=peers.handshakes,
        handshake_failures=peers.handshake_failures,
        handshakes_rejected=peers.rejected_requests,
        peer_restarts=peers.restarts_seen,
        failures_by_kind=tuple(sorted(c.failures_by_kind.items())),
        transfer_seconds=transfer_seconds,
        load_seconds=load_seconds,
    )
