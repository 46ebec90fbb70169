"""Peer liveness: consumers probe the producers they wait on; producers watch the probes.

A consumer with live transfers probes each producer rank they involve every
``timeout / 4`` seconds (a request on the control channel, answered on the producer's
listener thread with the id of the instance that answers). It gives those transfers up when
the producer has not answered for ``timeout`` seconds, and at once when it is known dead:
nothing listens at its address any more, or another instance answers there (it restarted,
and its memory went with it). Each probe names the transfers
with their capabilities, so the producer knows which consumer holds which transfer; it gives
a consumer's transfers up once that consumer's probes stop. The bounds are set so that the
side whose memory is written stops first:

- READ (the consumer's reads land in its own blocks, from the producer's): the consumer
  fails its reads after ``timeout`` without an answer; the producer frees the blocks after
  ``1.5 * timeout`` without a probe. An answer proves a probe arrived at most one interval
  before it, so the producer frees at least ``timeout / 4`` after the consumer stopped.
- WRITE (the producer writes the consumer's blocks): the consumer gives its blocks back at
  once only when the producer is known dead; one that is merely silent may still be writing,
  so its blocks stay fenced by the write-by lease. The producer stops writing after
  ``1.5 * timeout`` without a probe, and ends its transfers once their writes settled (a
  shorter bound would only give up pushes that a loaded host's late probes still cover).

Nothing is sent while no transfer is live, and nothing runs on the forward path.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from moriio.domain.protocol.messages import MAX_PROBE_CLAIMS, Message, Probe, ProbeReply
from moriio.domain.values.capability import is_token
from moriio.log import get_logger
from moriio.ports import Clock, ControlChannel, ControlChannelError, PeerAddress
from moriio.ports.control_channel import RequestTimeoutError, UntrustedPeerError

log = get_logger("moriio.liveness")

PROBES_PER_TIMEOUT = 4  # probe interval = timeout / this
READ_PRODUCER_SILENCE = 1.5  # a READ producer frees after this many timeouts without a probe
WRITE_PRODUCER_SILENCE = 1.5  # a WRITE producer stops writing after this many
PROBE_THREADS = 4
MAX_PROBE_WAIT = 1.0  # seconds a probe waits for its answer (at most one interval)
MAX_INBOX = 4096  # probes received and not yet taken by the worker (oldest dropped)
MAX_INBOX_CLAIMS = 1 << 16  # claims they may name in all (a probe beyond it is answered only)
MAX_CLAIMANTS = 4096  # consumers a producer tracks at once


class Lost(NamedTuple):
    """Transfers with one producer rank that stopped answering, or died."""

    producer: PeerAddress
    transfer_ids: tuple[str, ...]
    reason: str
    dead: bool  # the transfers' instance is gone: none of its transfers can touch our memory


class _NobodyListensError(Exception):
    """A probe got no answer, and the producer's host refused a connection to its port."""


@dataclass(slots=True)
class _Producer:
    # When the last answered probe was sent (or the first transfer watched): the producer
    # heard from us after that, so its own silence bound runs from later than ours.
    heard: float
    due: float  # when the next probe may be sent
    claims: dict[str, str] = field(default_factory=dict)  # transfer id -> capability
    instances: dict[str, str | None] = field(default_factory=dict)  # None: adopt the answer's
    since: dict[str, float] = field(default_factory=dict)  # when each transfer was watched
    probing: bool = False


class ProducerProbes:
    """Consumer side: probes the producer ranks of live transfers, says which were lost."""

    def __init__(
        self,
        channel: ControlChannel[Message],
        clock: Clock,
        *,
        instance_id: str,
        control: PeerAddress,
        timeout: float,
        background: bool,
    ) -> None:
        """``background``: send probes from a small thread pool (real channels); otherwise
        inline, inside :meth:`tick` (fakes whose clock only advances when told)."""
        self._channel = channel
        self._clock = clock
        self._instance_id = instance_id
        self._control = control
        self._timeout = timeout
        self._interval = timeout / PROBES_PER_TIMEOUT
        self._wait = min(self._interval, MAX_PROBE_WAIT)
        self._producers: dict[PeerAddress, _Producer] = {}
        self._producer_of: dict[str, list[PeerAddress]] = {}  # a transfer's producer ranks
        # (producer, its answer or why none, when the probe was sent)
        self._answers: queue.SimpleQueue[tuple[PeerAddress, Message | Exception, float]] = (
            queue.SimpleQueue()
        )
        self._pool = (
            ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="moriio-probe")
            if background
            else None
        )
        self.probes_sent = 0
        self.producers_lost = 0

    @property
    def num_watched(self) -> int:
        return len(self._producer_of)

    def watch(
        self, transfer_id: str, producer: PeerAddress, token: str, instance_id: str | None
    ) -> None:
        """Probe ``producer`` while ``transfer_id`` is live (a transfer may have several
        producer ranks: watch each). ``instance_id``: the producer instance the transfer
        belongs to (None: the first one that answers)."""
        if not self._timeout:
            return  # liveness is off
        entry = self._producers.get(producer)
        if entry is None:
            now = self._clock.now()
            entry = self._producers[producer] = _Producer(heard=now, due=now)
        entry.instances[transfer_id] = instance_id
        entry.since[transfer_id] = self._clock.now()
        if is_token(token):
            entry.claims[transfer_id] = token
        producers = self._producer_of.setdefault(transfer_id, [])
        if producer not in producers:
            producers.append(producer)

    def unwatch(self, transfer_id: str) -> None:
        for producer in self._producer_of.pop(transfer_id, ()):
            entry = self._producers[producer]
            entry.instances.pop(transfer_id, None)
            entry.since.pop(transfer_id, None)
            entry.claims.pop(transfer_id, None)
            if not entry.instances:
                del self._producers[producer]

    def tick(self, *, may_block: bool = True) -> list[Lost]:
        """Apply answers, send the probes that are due; the transfers given up since the
        last call (worker thread only; cheap while nothing is watched). Without
        ``may_block``, inline probes (which wait for their answer) are not sent."""
        if not self._producers:
            return []
        now = self._clock.now()
        lost = self._apply_answers()
        for address, entry in list(self._producers.items()):
            silent = now - entry.heard
            if silent > self._timeout:  # (a dead one was given up as soon as it was seen)
                reason = f"producer {address} did not answer liveness probes for {silent:.1f} s"
                lost.append(self._give_up(address, tuple(entry.instances), reason, False))
            elif not entry.probing and now >= entry.due and (may_block or self._pool):
                entry.due = now + self._interval
                entry.probing = True
                self._probe(address, tuple(entry.claims.items())[:MAX_PROBE_CLAIMS])
        return lost

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _probe(self, address: PeerAddress, claims: tuple[tuple[str, str], ...]) -> None:
        self.probes_sent += 1
        probe = Probe(self._instance_id, self._control, claims)
        sent = self._clock.now()
        if self._pool is None:
            self._answers.put((address, self._ask(address, probe), sent))
        else:
            self._pool.submit(lambda: self._answers.put((address, self._ask(address, probe), sent)))

    def _ask(self, address: PeerAddress, probe: Probe) -> Message | Exception:
        """The producer's answer, or why there is none; never raises (pool threads)."""
        try:
            return self._channel.request(address, probe, self._wait)
        except RequestTimeoutError as exc:
            try:
                listening = self._channel.is_listening(address, self._wait)
            except Exception:
                return exc
            return _NobodyListensError(str(exc)) if listening is False else exc
        except Exception as exc:
            return exc

    def _apply_answers(self) -> list[Lost]:
        lost: list[Lost] = []
        while True:
            try:
                address, answer, sent = self._answers.get_nowait()
            except queue.Empty:
                return lost
            entry = self._producers.get(address)
            if entry is None:
                continue
            entry.probing = False
            if isinstance(answer, ProbeReply):
                entry.heard = max(entry.heard, sent)
                gone = self._adopt(entry, answer.instance_id, sent)
                if gone:
                    reason = (
                        f"producer {address} restarted: instance {answer.instance_id!r} answers"
                    )
                    lost.append(self._give_up(address, gone, reason, True))
            elif isinstance(answer, _NobodyListensError):
                reason = f"producer {address} is gone: nothing listens at its address"
                # (transfers watched since the probe was sent may be a restarted instance's)
                gone = tuple(t for t, since in entry.since.items() if since <= sent)
                if gone:
                    lost.append(self._give_up(address, gone, reason, True))
            elif isinstance(answer, UntrustedPeerError) or (
                isinstance(answer, ControlChannelError)
                and not isinstance(answer, RequestTimeoutError)
            ):
                # It answered with an error, or we may not dial it: no proof that it died.
                entry.heard = max(entry.heard, sent)
                log.warning("liveness probe refused", producer=str(address), reason=str(answer))

    @staticmethod
    def _adopt(entry: _Producer, instance_id: str, sent: float) -> tuple[str, ...]:
        """Bind unbound transfers to the instance that answered; those of others are gone.
        Only transfers watched by the time the probe was sent are judged by its answer."""
        gone = []
        for tid, wanted in entry.instances.items():
            if entry.since[tid] > sent:
                continue
            if wanted is None:
                entry.instances[tid] = instance_id
            elif wanted != instance_id:
                gone.append(tid)
        return tuple(gone)

    def _give_up(
        self, address: PeerAddress, transfer_ids: tuple[str, ...], reason: str, restarted: bool
    ) -> Lost:
        for tid in transfer_ids:
            self.unwatch(tid)
        self.producers_lost += 1
        log.warning(
            "producer lost", producer=str(address), transfers=len(transfer_ids), reason=reason
        )
        return Lost(address, transfer_ids, reason, restarted)


class ProbeInbox:
    """Answers probes on the listener thread; hands them to the worker thread."""

    def __init__(self, instance_id: str, clock: Clock) -> None:
        self._reply = ProbeReply(instance_id)
        self._clock = clock
        self._probes: deque[tuple[Probe, float]] = deque()
        self._claims = 0  # named by the probes queued
        self._lock = threading.Lock()
        self.dropped = 0  # probes answered but not queued: the inbox was full

    def answer(self, probe: Probe) -> ProbeReply:
        """The answer; the probe is queued for the worker unless the inbox is full (a flood
        of probes costs the worker a bounded amount of work per pump)."""
        with self._lock:
            claims = len(probe.claims)
            if len(self._probes) < MAX_INBOX and self._claims + claims <= MAX_INBOX_CLAIMS:
                self._probes.append((probe, self._clock.now()))
                self._claims += claims
            else:
                self.dropped += 1
        return self._reply

    def take(self) -> list[tuple[Probe, float]]:
        """Probes received since the last call, with their arrival times."""
        with self._lock:
            taken = list(self._probes)
            self._probes.clear()
            self._claims = 0
        return taken


Claimant = tuple[PeerAddress, str]  # a consumer rank: its control address and instance id


class ConsumerClaims:
    """Producer side: which consumer holds each transfer, and when it last probed."""

    def __init__(self, silence: float) -> None:
        self._silence = silence
        self._heard: dict[Claimant, float] = {}
        self._claimants: dict[str, set[Claimant]] = {}
        self._transfers: dict[Claimant, set[str]] = {}
        self.claims_refused = 0

    @property
    def num_claimed(self) -> int:
        return len(self._claimants)

    def record(
        self, probes: Iterable[tuple[Probe, float]], holds: Callable[[str, str], bool]
    ) -> None:
        """Refresh the senders of ``probes``; bind each claim ``holds(transfer, token)``
        accepts (a live transfer, with its capability) to its sender."""
        for probe, at in probes:
            claimant = (probe.control, probe.instance_id)
            valid = [tid for tid, token in probe.claims if holds(tid, token)]
            self.claims_refused += len(probe.claims) - len(valid)
            # Only a sender that holds a transfer's capability is tracked (a flood of
            # strangers cannot crowd the consumers out).
            if claimant not in self._heard and (not valid or len(self._heard) >= MAX_CLAIMANTS):
                continue
            self._heard[claimant] = max(at, self._heard.get(claimant, at))
            for tid in valid:
                self.claim(tid, claimant, at)

    def claim(self, transfer_id: str, claimant: Claimant, now: float) -> None:
        self._heard.setdefault(claimant, now)
        self._claimants.setdefault(transfer_id, set()).add(claimant)
        self._transfers.setdefault(claimant, set()).add(transfer_id)

    def drop(self, transfer_id: str) -> None:
        for claimant in self._claimants.pop(transfer_id, ()):
            transfers = self._transfers.get(claimant)
            if transfers is not None:
                transfers.discard(transfer_id)
                if not transfers:
                    del self._transfers[claimant]
                    self._heard.pop(claimant, None)

    def silent(self, now: float) -> list[str]:
        """Transfers a claimant holds that has not probed for the silence bound; forgotten."""
        if not self._silence:
            return []  # liveness is off
        quiet = [c for c, heard in self._heard.items() if now - heard > self._silence]
        lost: list[str] = []
        for claimant in quiet:
            del self._heard[claimant]
            for tid in self._transfers.pop(claimant, ()):
                if tid not in lost:
                    lost.append(tid)
        for tid in lost:
            self.drop(tid)
        return lost
