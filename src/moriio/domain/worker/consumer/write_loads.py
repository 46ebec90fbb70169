"""Decode-side WRITE loads: announce destination blocks, await the producers' verdicts.

The request waits outside the forward (vLLM's asynchronous load) until every producer rank
it announced to sent ``write_done`` (or one ``write_failed``), or the fence deadline; every
outcome is reported through ``on_ended``. With a larger producer TP size a rank announces to
each producer rank of its group (each writes its heads into the same blocks); with a larger
consumer TP size it announces its share of the transfer to its one producer rank
(:mod:`moriio.domain.params.share_ids`). Each producer rank gets a capability of its own,
which its verdict must carry. The blocks are given back only once no announced producer can
write any more: all verdicts arrived, or the fence passed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from moriio.domain.kv.shards import producer_group, ranks_covered
from moriio.domain.ledgers.terminal_ids import TerminalIds
from moriio.domain.params.orders import AbortWriteOrder, ExpectWriteOrder
from moriio.domain.params.share_ids import share_transfer_id
from moriio.domain.params.transfer_params import PeerEndpoint, port_offset
from moriio.domain.protocol.messages import Release, RemoteBlocks, WriteDone, WriteFailed
from moriio.domain.timing.deadlines import DeadlineQueue
from moriio.domain.values.capability import new_token, same_token
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.liveness import ProducerProbes
from moriio.log import get_logger
from moriio.ports import PeerAddress

log = get_logger("moriio.consumer")

# (request id, local blocks, ok, reason, failure kind)
LoadEnded = Callable[[str, tuple[int, ...], bool, str, str], None]


@dataclass(slots=True)
class _Expected:
    transfer_id: str  # as the order names it (the announcement may name a share of it)
    request_id: str
    local_block_ids: tuple[int, ...]
    deadline: float
    started: float  # clock time the write expectation was announced
    # capability -> producer rank it was announced to, until that rank's verdict
    pending: dict[str, PeerAddress] = field(default_factory=dict)
    failure: tuple[str, str] | None = None  # (reason, kind) of the first failure
    released: bool = False  # a release was sent: the producers' verdicts are all we wait for


def notify_address(
    endpoint: PeerEndpoint, tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1
) -> PeerAddress:
    """The control (notify) address of ``endpoint``'s rank ``tp_rank`` of stage ``pp_rank``."""
    offset = port_offset(endpoint.dp_rank, tp_rank, tp_size, pp_rank, pp_size)
    return PeerAddress(endpoint.host, endpoint.notify_port + offset)


class WriteLoads:
    """Pushed loads this worker awaits, by the transfer id it announced under."""

    def __init__(self, ctx: WorkerContext, on_ended: LoadEnded) -> None:
        self._ctx = ctx
        self._on_ended = on_ended
        self._expected: dict[str, _Expected] = {}
        self._announced_as: dict[str, str] = {}  # transfer id -> the id announced (a share)
        self._deadlines: DeadlineQueue[str] = DeadlineQueue()
        self._fence_expired = TerminalIds()  # given back at the fence, without a verdict
        self.probes: ProducerProbes | None = None  # liveness of the producers written from

    @property
    def num_live(self) -> int:
        return len(self._expected)

    def expect(self, orders: Iterable[ExpectWriteOrder]) -> None:
        """Tell each producer rank where to write, and by when; wait for its verdict.

        The blocks are fenced by the write-by lease: the producer posts no write after it,
        each post ends within one transfer timeout, and one that does not settle is torn
        down after the quarantine timeout, so without a verdict the blocks are given back
        only after ``write_by + transfer_timeout + quarantine_timeout + clock_skew_allowance``.
        """
        ctx = self._ctx
        policy = ctx.policy
        for order in orders:
            peer_tp = order.peer.tp_size or ctx.tp_size
            try:
                ranks = producer_group(ctx.tp_rank, ctx.tp_size, peer_tp)
            except ValueError as exc:
                ctx.counters.transfers_started += 1
                self._refuse(order, peer_tp, str(exc))
                continue
            share = ctx.tp_size // peer_tp if ctx.tp_size > peer_tp else 1
            tid = share_transfer_id(order.transfer_id, ctx.tp_rank % share, share)
            if tid in self._expected:
                ctx.counters.messages_ignored += 1
                continue
            ctx.counters.transfers_started += 1
            # Measured before the sends: the fence may only end later than the lease says.
            deadline = policy.write_fence(ctx.clock.now())
            write_by = policy.write_by(ctx.wall_now())
            now = ctx.clock.now()
            blocks = order.local_block_ids
            expected = _Expected(order.transfer_id, order.request_id, blocks, deadline, now)
            self._expected[tid] = expected
            self._announced_as[order.transfer_id] = tid
            self._deadlines.set(tid, deadline)
            pp = (ctx.pp_rank, ctx.pp_size)
            for rank in ranks:
                producer = notify_address(order.peer, rank, peer_tp, *pp)
                if expected.failure is not None:  # announce nothing more: only free blocks
                    release = Release(tid, ctx.tp_size, ctx.tp_rank, "")
                    ctx.send(producer, release, "release (another producer rank failed)")
                    continue
                token = new_token()
                announce = RemoteBlocks(
                    transfer_id=tid,
                    request_id=order.request_id,
                    block_ids=order.local_block_ids,
                    first_block=order.first_block,
                    consumer_dp_rank=ctx.dp_rank,
                    consumer_tp_rank=ctx.tp_rank,
                    consumer_tp_size=ctx.tp_size,
                    reply_to=ctx.control,
                    consumer_instance_id=ctx.peers.instance_id,
                    write_by=write_by,
                    token=token,
                    consumer_generation=ctx.peers.generation,
                    prompt=order.prompt,
                )
                if not ctx.send(producer, announce, "remote_blocks"):
                    reason = f"could not reach producer {producer}"
                    self._failed(tid, expected, reason, "unreachable")
                    continue
                expected.pending[token] = producer
                if self.probes is not None:
                    self.probes.watch(tid, producer, token, None)
            self._maybe_end(tid)

    def _refuse(self, order: ExpectWriteOrder, peer_tp: int, reason: str) -> None:
        """A pairing that cannot run: tell every producer rank, once, to free its blocks
        (nothing was announced, so nothing can be written), and fail the load."""
        ctx = self._ctx
        release = Release(order.transfer_id, ctx.tp_size, ctx.tp_rank, "")
        for rank in ranks_covered(ctx.tp_rank, ctx.tp_size, peer_tp):
            producer = notify_address(order.peer, rank, peer_tp, ctx.pp_rank, ctx.pp_size)
            ctx.send(producer, release, "release (refused pairing)")
        self._on_ended(order.request_id, order.local_block_ids, False, reason, "tp_mismatch")

    def abort(self, orders: Iterable[AbortWriteOrder]) -> None:
        """The requests ended early: ask producers to stop; keep the blocks until they confirm.

        The deadline is not shortened: until it passes, a producer that missed the release
        (or got the announcement late) may still write into the blocks before the write-by
        lease, so they must not be reused before the verdicts or the deadline. An abort
        names its request: another request's expectation under the same transfer id (one
        announced in the same step, after this request's load ended) is left alone.
        """
        for order in orders:
            tid = self._announced_as.get(order.transfer_id, order.transfer_id)
            expected = self._expected.get(tid)
            if expected is None or expected.released or expected.request_id != order.request_id:
                continue
            self._release(tid, expected, "release (abort)")

    def on_write_done(self, message: WriteDone) -> None:
        found = self._verdict_for(message)
        if found is not None:
            self._maybe_end(message.transfer_id)

    def on_write_failed(self, message: WriteFailed) -> None:
        found = self._verdict_for(message)
        if found is None:
            return
        self._failed(message.transfer_id, found, f"producer reported: {message.reason}", "write")
        self._maybe_end(message.transfer_id)

    def lose(self, transfer_id: str, reason: str) -> None:
        """The producer stopped answering liveness probes, or restarted: give the blocks back
        once no other producer rank of the transfer can write into them.

        A live producer stops writing after half the liveness bound without our probes
        (see :mod:`moriio.domain.worker.liveness`), so no write of it lands after this.
        """
        expected = self._expected.get(transfer_id)
        if expected is None:
            return
        self._fence_expired.add(transfer_id)
        if expected.failure is None:
            expected.failure = (reason, "lost")
        if not expected.released:
            self._release(transfer_id, expected, "release (producer lost)")
        expected.pending.clear()  # (liveness gives up every producer rank of the transfer)
        self._maybe_end(transfer_id)

    def give_up_all(self, reason: str) -> None:
        """Give every expected write's blocks back (the KV memory is about to be released;
        the producers were told to stop first, see :mod:`moriio.domain.worker.sleep`)."""
        for tid in list(self._expected):
            self._unwatch(tid)
            self.lose(tid, reason)

    def expire(self, now: float) -> None:
        """Give back the blocks of writes whose fence passed without every verdict."""
        ctx = self._ctx
        for tid in self._deadlines.pop_due(now):
            # The write-by lease, every write's in-flight and quarantine time and the skew
            # allowance have passed: no write of this transfer can still land.
            expected = self._expected[tid]
            if not expected.released:
                self._release(tid, expected, "release (expired)")
            self._fence_expired.add(tid)
            ctx.counters.quarantined_blocks += len(expected.local_block_ids)
            ctx.counters.transfers_expired += 1
            expected.failure = ("no write_done before the deadline", "expired")
            expected.pending.clear()
            self._maybe_end(tid)

    def _release(self, transfer_id: str, expected: _Expected, what: str) -> None:
        """Ask every producer rank still writing to stop (each with its capability)."""
        expected.released = True
        for token, producer in expected.pending.items():
            self._ctx.send(producer, Release(transfer_id, 1, 0, token), what)

    def _failed(self, transfer_id: str, expected: _Expected, reason: str, kind: str) -> None:
        """A producer rank failed: the load fails; the others are asked to stop at once."""
        if expected.failure is None:
            expected.failure = (reason, kind)
        if not expected.released and expected.pending:
            self._release(transfer_id, expected, "release (another producer rank failed)")

    def _maybe_end(self, transfer_id: str) -> None:
        """End the load once no announced producer rank can write any more."""
        expected = self._expected.get(transfer_id)
        if expected is None or expected.pending:
            return
        del self._expected[transfer_id]
        self._deadlines.discard(transfer_id)
        self._unwatch(transfer_id)
        self._announced_as.pop(expected.transfer_id, None)
        if expected.failure is None:
            self._ctx.counters.transfers_succeeded += 1
            self._ctx.counters.load_seconds.append(self._ctx.clock.now() - expected.started)
            self._on_ended(expected.request_id, expected.local_block_ids, True, "", "")
        else:
            reason, kind = expected.failure
            self._on_ended(expected.request_id, expected.local_block_ids, False, reason, kind)

    def _verdict_for(self, message: WriteDone | WriteFailed) -> _Expected | None:
        """The expectation ``message`` answers for one producer rank: None when it answers
        none (unknown, or forged)."""
        tid = message.transfer_id
        expected = self._expected.get(tid)
        if expected is None:
            self._late_verdict(tid)
            return None
        token = next((t for t in expected.pending if same_token(message.token, t)), None)
        if token is None:
            # Without a capability we handed out a verdict proves nothing: the blocks stay.
            self._ctx.counters.verdicts_refused += 1
            log.warning("verdict refused: it lacks the transfer's capability", transfer_id=tid)
            return None
        del expected.pending[token]
        return expected

    def _unwatch(self, transfer_id: str) -> None:
        if self.probes is not None:
            self.probes.unwatch(transfer_id)

    def _late_verdict(self, transfer_id: str) -> None:
        """A verdict for a transfer we no longer expect: count it, and say if it is late."""
        counters = self._ctx.counters
        counters.messages_ignored += 1
        if transfer_id in self._fence_expired:
            counters.late_completions += 1
            log.warning("verdict arrived after the blocks were given back", transfer_id=transfer_id)
