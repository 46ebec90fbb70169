"""Connected peers: which instance answers at each address, and when to handshake again.

A handshake is one request over the control channel, bounded by ``handshake_timeout``
(:mod:`moriio.domain.worker.handshake_client` asks, and
:mod:`moriio.domain.worker.handshake_responder` answers peers that ask us). The consumer's
read path never waits for one: :meth:`PeerDirectory.begin_handshake` runs it off the
caller's path, and :meth:`PeerDirectory.settle_handshakes` applies the answers on the
worker's thread.
"""

from __future__ import annotations

from collections import OrderedDict

from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.messages import HandshakeReply, HandshakeRequest, Message, Retired
from moriio.domain.worker.generations import RetiredGenerations, serves_generation
from moriio.domain.worker.handshake_client import Answer, HandshakeClient
from moriio.domain.worker.handshake_responder import HandshakeResponder
from moriio.domain.worker.kv_registry import LocalKV
from moriio.domain.worker.liveness import ProbeInbox
from moriio.domain.worker.peer_checks import (
    ConnectedPeer,
    PeerGenerationError,
    PeerRestartedError,
    PeerUnavailableError,
)
from moriio.ports import Clock, ControlChannel, PeerAddress, PeerId, TransferEngine

MAX_GONE_INSTANCES = 4096
MAX_FAILED_PEERS = 4096  # addresses remembered as failing (with their back-off)
MAX_TRIED = 16  # instance ids of one failing address handshaken despite its back-off
MAX_PENDING_HANDSHAKES = 64  # handshakes running or queued in the background at once

Handshaken = ConnectedPeer | PeerUnavailableError  # a settled handshake: the peer, or why not


class PeerDirectory:
    """Connected peers by the address that was dialed, plus the answer to peers' handshakes.

    Every peer has an instance id that changes whenever its process restarts. A caller whose
    transfer belongs to one instance passes its id to :meth:`connect`; a connection to
    another instance at the same address is never used for it. Within an instance, the
    registration generation (one more after every wake from sleep mode) names the memory a
    transfer's blocks lie in: a connection to another generation is never used for it either
    (see :mod:`moriio.domain.worker.sleep`).
    """

    def __init__(
        self,
        *,
        engine: TransferEngine,
        channel: ControlChannel[Message],
        local: LocalKV,
        fingerprint: Fingerprint,
        control: PeerAddress,
        dp_rank: int,
        tp_rank: int,
        instance_id: str,
        clock: Clock,
        handshake_timeout: float,
        retry_after: float = 1.0,
        max_retry_after: float = 30.0,
        background: bool = False,
        suspect_timeout: float = 0.0,
        signs_handoffs: bool = False,
        requires_handoff_key: bool = False,
    ) -> None:
        """``background``: run :meth:`begin_handshake`'s requests on threads (real channels);
        otherwise inline (fakes whose clock only advances when told). ``suspect_timeout``
        (0: none) bounds a handshake with a peer a transfer just failed with: the liveness
        bound, within which a live peer answers its probes. ``signs_handoffs``: our replies
        carry our engine's hand-off key (READ producer; see :meth:`set_handoff_key`).
        ``requires_handoff_key``: every peer we ask must give its key (READ consumer)."""
        if not instance_id:
            raise ValueError("instance_id must be a non-empty str")
        if not 0 < retry_after <= max_retry_after:
            raise ValueError(
                f"need 0 < retry_after <= max_retry_after, got {retry_after}, {max_retry_after}"
            )
        self._engine = engine
        self._clock = clock
        self._timeout = handshake_timeout
        self._suspect_timeout = min(suspect_timeout or handshake_timeout, handshake_timeout)
        self._retry_after = retry_after
        self._max_retry_after = max_retry_after
        self.instance_id = instance_id
        self._peers: dict[PeerAddress, ConnectedPeer] = {}
        self._suspect: set[PeerAddress] = set()  # handshake again before the next use
        self._restarted: set[PeerAddress] = set()  # addresses that changed instances
        self._gone: OrderedDict[str, None] = OrderedDict()  # instances replaced by another
        # address -> (no new attempt before, reason, consecutive failures, instance ids that
        # were tried despite the back-off: a transfer of an instance not tried yet is proof
        # that a process answered for it since, as after a restart, and handshakes at once)
        self._failed_until: dict[PeerAddress, tuple[float, str, int, set[str]]] = {}
        self.handshakes = 0
        self.handshake_failures = 0
        self.restarts_seen = 0  # connections replaced: a new instance answered at the address
        self._pending: set[PeerAddress] = set()  # handshakes begun, not settled
        self._retired = RetiredGenerations(MAX_GONE_INSTANCES)
        self._fingerprint = fingerprint
        self._ours = (control, dp_rank, tp_rank)
        self.generation = 1
        request, reply = self._handshakes(local)
        slicing = {layer.name: (layer.slicing, layer.geometry.block_len) for layer in local}
        self._client = HandshakeClient(
            engine, channel, request, background, slicing, requires_key=requires_handoff_key
        )
        # What a peer handshaking with us gets; liveness probes are answered for us too.
        self._responder = HandshakeResponder(
            fingerprint, reply, ProbeInbox(instance_id, clock), signs=signs_handoffs
        )
        self.set_handoff_key = self._responder.set_handoff_key
        self.respond = self._responder.respond
        self.probes = self._responder.probes
        self.background = background

    def _handshakes(self, local: LocalKV) -> tuple[HandshakeRequest, HandshakeReply]:
        """What we send peers, and answer them, for ``local`` in this generation."""
        control, dp_rank, tp_rank = self._ours
        request = HandshakeRequest(
            fingerprint=self._fingerprint,
            engine_metadata=self._engine.metadata(),
            layers=local.layer_regions(),
            control=control,
            dp_rank=dp_rank,
            tp_rank=tp_rank,
            instance_id=self.instance_id,
            generation=self.generation,
            spans=local.span_descriptors(),
        )
        reply = HandshakeReply(
            **{field: getattr(request, field) for field in HandshakeRequest.__slots__}
        )
        return request, reply

    def retire(self) -> tuple[PeerAddress, ...]:
        """This worker's KV memory is about to be released: refuse handshakes from now on
        and return the control addresses of every peer that holds our regions (those our
        handshake reply reached), to be told."""
        reason = (
            f"asleep: registration generation {self.generation} of instance "
            f"{self.instance_id!r} is retired (handshake again after its wake)"
        )
        return self._responder.retire(reason)

    def reregister(self, local: LocalKV) -> None:
        """Our KV memory is registered again (after a wake): the next generation's regions
        are what handshakes send and answer from now on."""
        self.generation += 1
        request, reply = self._handshakes(local)
        self._client.request = request
        self._responder.wake(reply)

    def on_retired(self, message: Retired) -> list[PeerId]:
        """A peer retired a registration generation: refuse it from now on and drop every
        connection to it (their in-flight transfers fail); returns the engine peers dropped,
        whose batches must end before the peer is told we no longer touch its memory."""
        instance, generation = message.instance_id, message.generation
        engines: list[PeerId] = []
        for address, peer in list(self._peers.items()):
            if peer.instance_id == instance and peer.generation <= generation:
                engines.append(peer.engine)
                self._retired.add(instance, generation, peer.handoff_key)
                self._drop(address)
        self._retired.add(instance, generation)
        return engines

    def retired_handoff_key(self, instance_id: str) -> bytes:
        """The key a peer instance that retired a generation signed with (empty: unknown)."""
        return self._retired.handoff_key(instance_id)

    @property
    def rejected_requests(self) -> int:
        """Handshake requests refused (not a handshake, or an incompatible peer)."""
        return self._responder.rejected_requests

    def connect(
        self, address: PeerAddress, instance_id: str | None = None, generation: int | None = None
    ) -> ConnectedPeer:
        """The peer at ``address``, handshaking on first use and after :meth:`forget`.

        ``instance_id``: the peer instance the caller's transfer belongs to. When the
        connection is to another instance, one fresh handshake tells whether the peer
        restarted (the connection is then replaced) or the transfer's instance is the one
        that is gone. None (the transfer does not say): only safe while the address never
        changed instances, so it is refused at an address where a restart was seen.

        ``generation``: the registration generation the transfer's blocks lie in (None: not
        stated, only safe while the peer never retired one).

        Raises :class:`PeerRestartedError` when the transfer cannot belong to the instance
        at ``address``, :class:`PeerGenerationError` when its generation is retired or not
        the one the peer serves, :class:`PeerUnavailableError` when the peer cannot be
        reached or used.
        """
        peer = self.lookup(address, instance_id, generation)
        if peer is not None:
            return peer
        answer = self._client.ask_safely(address, self._timeout_for(address))
        settled = self._settle(address, answer)
        return self.check_serves(settled, address, instance_id, generation)

    def lookup(
        self, address: PeerAddress, instance_id: str | None = None, generation: int | None = None
    ) -> ConnectedPeer | None:
        """The peer at ``address`` if it can serve ``instance_id`` without a handshake; None
        when a handshake must tell. Raises as :meth:`connect` does for what is already known
        (a gone instance, a retired generation, a peer still backed off after failing)."""
        peer = self._peers.get(address)
        if (
            peer is not None
            and address not in self._suspect
            and self._serves(peer, instance_id)
            and serves_generation(address, peer, generation)
        ):
            return peer
        self._check_instance(address, instance_id, None)
        self._retired.check(address, instance_id, generation)
        failed = self._failed_until.get(address)
        if failed is not None and self._clock.now() < failed[0]:
            tried = failed[3]
            if instance_id is None or instance_id in tried or len(tried) >= MAX_TRIED:
                raise PeerUnavailableError(f"peer {address} unavailable: {failed[1]}")
            tried.add(instance_id)
        return None

    def check_serves(
        self,
        settled: Handshaken,
        address: PeerAddress,
        instance_id: str | None,
        generation: int | None = None,
    ) -> ConnectedPeer:
        """The just-handshaken peer, if it can serve ``instance_id`` and ``generation``;
        raises otherwise."""
        if isinstance(settled, PeerUnavailableError):
            raise settled
        self._check_instance(address, instance_id, settled.instance_id)
        if not serves_generation(address, settled, generation):
            raise PeerGenerationError(
                f"peer {address} serves registration generation {settled.generation}: the "
                f"transfer names generation {generation}, which it does not have"
            )
        return settled

    @property
    def handshake_timeout(self) -> float:
        return self._timeout

    def handshake_wait_deadline(self, now: float) -> float:
        """Until when work parked at ``now`` waits for a handshake: one handshake, plus its
        wait for a free handshake thread."""
        return now + 2 * self._timeout

    @property
    def num_pending_handshakes(self) -> int:
        return len(self._pending)

    def begin_handshake(self, address: PeerAddress) -> None:
        """Handshake with ``address`` off the caller's path (once, however many ask); the
        answer is applied by :meth:`settle_handshakes`. Raises
        :class:`PeerUnavailableError` when too many handshakes are pending already."""
        if address in self._pending:
            return
        if len(self._pending) >= MAX_PENDING_HANDSHAKES:
            raise PeerUnavailableError(
                f"handshake with {address} not started: {len(self._pending)} pending already"
            )
        self._pending.add(address)
        self._client.begin(address, self._timeout_for(address))

    def settle_handshakes(self) -> dict[PeerAddress, Handshaken]:
        """Apply the handshakes that ended since the last call (worker thread only)."""
        settled: dict[PeerAddress, Handshaken] = {}
        for address, answer in self._client.answers():
            self._pending.discard(address)
            settled[address] = self._settle(address, answer)
        return settled

    def _timeout_for(self, address: PeerAddress) -> float:
        return self._suspect_timeout if address in self._suspect else self._timeout

    def _settle(self, address: PeerAddress, answer: Answer) -> Handshaken:
        """Record a handshake's answer: connect (or reconnect after a restart) on a reply,
        back off on a failure."""
        failed = self._failed_until.get(address)
        try:
            if isinstance(answer, Exception):
                if isinstance(answer, PeerUnavailableError):
                    raise answer
                raise PeerUnavailableError(f"handshake with {address} failed: {answer}")
            if self._retired.covers(answer.instance_id, answer.generation):
                raise PeerGenerationError(
                    f"peer {address} answered with registration generation "
                    f"{answer.generation}, which it retired"
                )
            peer = self._peers.get(address)
            self._suspect.discard(address)
            if (
                peer is not None
                and peer.instance_id == answer.instance_id
                and (peer.generation != answer.generation)
            ):
                self._drop(address)  # registered again after a wake: import the new regions
                peer = None
            if peer is None or answer.instance_id != peer.instance_id:
                if peer is not None:
                    # The peer restarted: its old engine and regions are gone.
                    self.restarts_seen += 1
                    self._mark_gone(peer.instance_id)
                    self._restarted.update(self._drop(address))
                peer = self._client.attach(address, answer)
                self._peers[address] = peer
            self.handshakes += 1
        except PeerUnavailableError as exc:
            self.handshake_failures += 1
            # Back off from the end of the attempt (a handshake that timed out must not be
            # retried at once by the next transfer of the same step), doubling while the peer
            # stays unreachable, so a dead peer costs a handshake rarely.
            streak = failed[2] + 1 if failed is not None else 1
            delay = min(self._retry_after * 2 ** (streak - 1), self._max_retry_after)
            tried = failed[3] if failed is not None else set()
            self._failed_until[address] = (self._clock.now() + delay, str(exc), streak, tried)
            if len(self._failed_until) > MAX_FAILED_PEERS:
                self._failed_until.pop(next(iter(self._failed_until)))
            return exc
        self._failed_until.pop(address, None)
        return peer

    def forget(self, address: PeerAddress) -> None:
        """A transfer with the peer failed: handshake again before its next use.

        The connection is replaced only if that handshake finds a new instance: tearing down
        a live peer's connection would fail its in-flight transfers while the transport may
        still be moving their bytes.
        """
        if address in self._peers:
            self._suspect.add(address)

    def torn_down(self, engine_peer: PeerId) -> None:
        """The engine's connection ``engine_peer`` was torn down: handshake again before the
        next use of every address that reached it."""
        for address in [a for a, p in self._peers.items() if p.engine == engine_peer]:
            self._drop(address)

    def connected(self, address: PeerAddress) -> ConnectedPeer | None:
        """The connection to the peer dialed at ``address``, if there is one."""
        return self._peers.get(address)

    def is_gone(self, instance_id: str | None) -> bool:
        """Whether ``instance_id`` is known to have been replaced by a restart."""
        return instance_id is not None and instance_id in self._gone

    def close(self) -> None:
        self._client.close()
        for address in list(self._peers):
            self._drop(address)

    def _drop(self, address: PeerAddress) -> list[PeerAddress]:
        """Disconnect from the peer at ``address`` and from every other address that reached
        the same engine; returns those addresses."""
        peer = self._peers.get(address)
        if peer is None:
            return []
        dropped = [a for a, p in self._peers.items() if p.engine == peer.engine]
        for alias in dropped:
            del self._peers[alias]
            self._suspect.discard(alias)
        self._engine.remove_peer(peer.engine)
        return dropped

    def _mark_gone(self, instance_id: str) -> None:
        self._gone[instance_id] = None
        if len(self._gone) > MAX_GONE_INSTANCES:
            self._gone.popitem(last=False)

    def _serves(self, peer: ConnectedPeer, instance_id: str | None) -> bool:
        if instance_id is None:
            return peer.address not in self._restarted
        return instance_id == peer.instance_id

    def _check_instance(self, address: PeerAddress, wanted: str | None, live: str | None) -> None:
        """Refuse a transfer that cannot belong to the instance ``live`` at ``address``
        (``live`` None: not handshaken yet, refuse only what is known to be gone)."""
        if wanted is None:
            if address in self._restarted:
                raise PeerRestartedError(
                    f"peer {address} restarted, and the transfer does not name the instance "
                    "that holds its blocks (kv_transfer_params lack remote_instance_id)"
                )
        elif wanted in self._gone or (live is not None and wanted != live):
            self._mark_gone(wanted)  # the address answers as another instance now
            raise PeerRestartedError(
                f"peer {address} restarted: instance {wanted!r} is gone with its memory"
            )
