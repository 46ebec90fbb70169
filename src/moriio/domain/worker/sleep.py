"""Sleep mode: retire the KV registration before its memory is released, register it again,
under the next generation, after the wake.

Going to sleep (:meth:`SleepCycle.retire`): every post is refused from then on (no byte of it
moves), every live transfer is given up, handshakes are refused by name, and every peer that
holds our regions (those our handshake reply reached) is sent :class:`Retired`. The memory
may be released once each of them answered :class:`RetiredAck` and none of our own batches
is in flight or quarantined (:meth:`SleepCycle.drained`), or once
:meth:`~moriio.domain.timing.policy.TransferPolicy.retire_deadline` passed: by then a live
peer's batches with us ended, or were torn down by its own quarantine.

A peer told (:class:`RetirementAcks`) drops its connections to that generation (their
in-flight transfers fail), refuses every transfer naming it, and acknowledges once none of
its batches with us can still move a byte. After the wake (:meth:`SleepCycle.wake`) our
handshakes carry the next generation and the new regions; peers handshake again before
their next transfer (see :mod:`moriio.domain.worker.generations`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from moriio.domain.protocol.messages import Retired, RetiredAck
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.kv_registry import LocalKV
from moriio.log import get_logger
from moriio.ports import PeerAddress, PeerId

log = get_logger("moriio.worker")


class SleepCycle:
    """This worker's side: retire, wait for the peers told, register again."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._waiting: set[PeerAddress] = set()  # told, not acknowledged yet
        self.asleep = False

    def retire(self, give_up: Callable[[str], None]) -> None:
        """Stop every transfer that could touch our memory and tell the peers that hold our
        regions; ``give_up`` ends every live transfer with the reason given."""
        if self.asleep:
            return
        ctx = self._ctx
        generation = ctx.peers.generation
        reason = f"this worker sleeps: registration generation {generation} is retired"
        ctx.poster.refuse_posts(reason)
        holders = ctx.peers.retire()
        notice = Retired(ctx.peers.instance_id, generation, ctx.control)
        for holder in holders:
            ctx.send(holder, notice, "retired")  # a refused send stays unconfirmed
        self._waiting = set(holders)
        self.asleep = True
        log.info("registration retired", generation=generation, peers_told=len(holders))
        give_up(reason)  # last: should it fail, the peers were told all the same

    def on_ack(self, message: RetiredAck) -> None:
        ctx = self._ctx
        if message.instance_id == ctx.peers.instance_id and message.generation == (
            ctx.peers.generation
        ):
            self._waiting.discard(message.control)
        else:
            ctx.counters.messages_ignored += 1

    @property
    def unconfirmed(self) -> tuple[PeerAddress, ...]:
        """The peers told that have not acknowledged yet."""
        return tuple(sorted(self._waiting, key=str))

    def drained(self) -> bool:
        """Whether nothing can land in (or be read from) our memory any more."""
        return self.asleep and not self._waiting and self._ctx.poster.num_inflight == 0

    def wake(self, local: LocalKV) -> None:
        """``local`` is our KV registered again: serve it under the next generation."""
        ctx = self._ctx
        ctx.kv = local
        ctx.peers.reregister(local)
        ctx.poster.refuse_posts(None)
        self._waiting.clear()
        self.asleep = False
        log.info("registration restored", generation=ctx.peers.generation, layers=len(local))


@dataclass(frozen=True, slots=True)
class _PendingAck:
    notice: Retired
    engines: tuple[PeerId, ...]  # our engine's connections to the retired registration


class RetirementAcks:
    """A peer's side: drop what reached a retired registration, acknowledge once none of our
    batches with it can still move a byte."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._pending: list[_PendingAck] = []

    def __len__(self) -> int:
        return len(self._pending)

    def on_retired(self, notice: Retired) -> None:
        engines = tuple(self._ctx.peers.on_retired(notice))
        self._pending.append(_PendingAck(notice, engines))
        log.info(
            "peer retired a registration",
            peer=str(notice.control),
            generation=notice.generation,
            connections_dropped=len(engines),
        )

    def send_due(self) -> None:
        """Acknowledge each retirement none of whose batches is in flight any more."""
        ctx = self._ctx
        for pending in [p for p in self._pending if not ctx.poster.touches(p.engines)]:
            self._pending.remove(pending)
            notice = pending.notice
            ack = RetiredAck(notice.instance_id, notice.generation, ctx.control)
            ctx.send(notice.control, ack, "retired_ack")
