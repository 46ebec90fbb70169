"""Decode-side WRITE loads: announce destination blocks, await the producer's verdict.

The request waits outside the forward (vLLM's asynchronous load) until ``write_done``,
``write_failed`` or the fence deadline; every outcome is reported through ``on_ended``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from moriio.domain.ledgers.terminal_ids import TerminalIds
from moriio.domain.params.orders import AbortWriteOrder, ExpectWriteOrder
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
    request_id: str
    local_block_ids: tuple[int, ...]
    producer: PeerAddress
    deadline: float
    started: float  # clock time the write expectation was announced
    token: str  # our capability for the transfer: verdicts must carry it
    released: bool = False  # a release was sent: the producer's verdict is all we wait for


def notify_address(
    endpoint: PeerEndpoint, tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1
) -> PeerAddress:
    """The control (notify) address of ``endpoint``'s rank ``tp_rank`` of stage ``pp_rank``."""
    offset = port_offset(endpoint.dp_rank, tp_rank, tp_size, pp_rank, pp_size)
    return PeerAddress(endpoint.host, endpoint.notify_port + offset)


class WriteLoads:
    """Pushed loads this worker awaits, by transfer id."""

    def __init__(self, ctx: WorkerContext, on_ended: LoadEnded) -> None:
        self._ctx = ctx
        self._on_ended = on_ended
        self._expected: dict[str, _Expected] = {}
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
            tid = order.transfer_id
            if tid in self._expected:
                ctx.counters.messages_ignored += 1
                continue
            peer_tp = order.peer.tp_size or ctx.tp_size
            ctx.counters.transfers_started += 1
            if peer_tp != ctx.tp_size:
                self._on_ended(
                    order.request_id,
                    order.local_block_ids,
                    False,
                    f"WRITE mode needs equal TP sizes (ours {ctx.tp_size}, producer {peer_tp})",
                    "tp_mismatch",
                )
                continue
            producer = notify_address(order.peer, ctx.tp_rank, peer_tp, ctx.pp_rank, ctx.pp_size)
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
                write_by=policy.write_by(ctx.wall_now()),
                token=token,
                prompt=order.prompt,
            )
            # Measured before the send: the fence may only end later than the lease says.
            deadline = policy.write_fence(ctx.clock.now())
            if not ctx.send(producer, announce, "remote_blocks"):
                self._on_ended(
                    order.request_id,
                    order.local_block_ids,
                    False,
                    f"could not reach producer {producer}",
                    "unreachable",
                )
                continue
            self._expected[tid] = _Expected(
                order.request_id, order.local_block_ids, producer, deadline, ctx.clock.now(), token
            )
            self._deadlines.set(tid, deadline)
            if self.probes is not None:
                self.probes.watch(tid, producer, token, None)

    def abort(self, orders: Iterable[AbortWriteOrder]) -> None:
        """The requests ended early: ask producers to stop; keep the blocks until they confirm.

        The deadline is not shortened: until it passes, a producer that missed the release
        (or got the announcement late) may still write into the blocks before the write-by
        lease, so they must not be reused before the verdict or the deadline. An abort
        names its request: another request's expectation under the same transfer id (one
        announced in the same step, after this request's load ended) is left alone.
        """
        ctx = self._ctx
        for order in orders:
            expected = self._expected.get(order.transfer_id)
            if expected is None or expected.released or expected.request_id != order.request_id:
                continue
            expected.released = True
            release = Release(order.transfer_id, 1, 0, expected.token)
            ctx.send(expected.producer, release, "release (abort)")

    def on_write_done(self, message: WriteDone) -> None:
        expected = self._verdict_for(message)
        if expected is None:
            return
        self._deadlines.discard(message.transfer_id)
        self._ctx.counters.transfers_succeeded += 1
        self._ctx.counters.load_seconds.append(self._ctx.clock.now() - expected.started)
        self._on_ended(expected.request_id, expected.local_block_ids, True, "", "")

    def on_write_failed(self, message: WriteFailed) -> None:
        expected = self._verdict_for(message)
        if expected is None:
            return
        self._deadlines.discard(message.transfer_id)
        self._on_ended(
            expected.request_id,
            expected.local_block_ids,
            False,
            f"producer reported: {message.reason}",
            "write",
        )

    def lose(self, transfer_id: str, reason: str) -> None:
        """The producer stopped answering liveness probes, or restarted: give the blocks back.

        A live producer stops writing after half the liveness bound without our probes
        (see :mod:`moriio.domain.worker.liveness`), so no write of it lands after this.
        """
        expected = self._expected.pop(transfer_id, None)
        if expected is None:
            return
        self._deadlines.discard(transfer_id)
        self._fence_expired.add(transfer_id)
        if not expected.released:
            release = Release(transfer_id, 1, 0, expected.token)
            self._ctx.send(expected.producer, release, "release (producer lost)")
        self._on_ended(expected.request_id, expected.local_block_ids, False, reason, "lost")

    def expire(self, now: float) -> None:
        """Give back the blocks of writes whose fence passed without a verdict."""
        ctx = self._ctx
        for tid in self._deadlines.pop_due(now):
            # The write-by lease, every write's in-flight and quarantine time and the skew
            # allowance have passed: no write of this transfer can still land.
            expected = self._expected.pop(tid)
            self._unwatch(tid)
            if not expected.released:
                release = Release(tid, 1, 0, expected.token)
                ctx.send(expected.producer, release, "release (expired)")
            self._fence_expired.add(tid)
            ctx.counters.quarantined_blocks += len(expected.local_block_ids)
            ctx.counters.transfers_expired += 1
            self._on_ended(
                expected.request_id,
                expected.local_block_ids,
                False,
                "no write_done before the deadline",
                "expired",
            )

    def _verdict_for(self, message: WriteDone | WriteFailed) -> _Expected | None:
        """The expectation ``message`` ends: None when it ends none (unknown, or forged)."""
        tid = message.transfer_id
        expected = self._expected.get(tid)
        if expected is None:
            self._late_verdict(tid)
            return None
        if not same_token(message.token, expected.token):
            # Without our capability a verdict proves nothing: the blocks stay fenced.
            self._ctx.counters.verdicts_refused += 1
            log.warning("verdict refused: it lacks the transfer's capability", transfer_id=tid)
            return None
        del self._expected[tid]
        self._unwatch(tid)
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
