"""The answering half of handshakes: what a peer handshaking with us (or probing us) gets."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict

from moriio.domain.protocol.fingerprint import Fingerprint, IncompatiblePeerError
from moriio.domain.protocol.messages import (
    HandshakeRejected,
    HandshakeReply,
    HandshakeRequest,
    Message,
    Probe,
)
from moriio.domain.worker.liveness import ProbeInbox
from moriio.domain.worker.peer_checks import log_refusal
from moriio.ports import PeerAddress

MAX_HOLDERS = 4096  # peers remembered as holding our regions (the oldest are forgotten)

NO_KEY_YET = "hand-off key not ready: this engine has scheduled no request yet; retry"


class HandshakeResponder:
    """Answers handshake requests with our reply, or a rejection that names only the fields
    that differ; liveness probes go to :attr:`probes`. Runs on listener threads.

    Remembers the control address of every peer our reply reached (it holds our regions):
    :meth:`retire` stops answering and returns them, atomically, so that no peer gets our
    regions without being among those told that they are about to be released.

    ``signs``: this engine signs READ hand-offs, so a reply carries its key; until the key
    arrives from the engine's scheduler (:meth:`set_handoff_key`), handshakes are refused
    with :data:`NO_KEY_YET` (the asker backs off and retries). Hand-offs exist only after
    the scheduler's first step, which carries the key.
    """

    def __init__(
        self,
        fingerprint: Fingerprint,
        reply: HandshakeReply,
        probes: ProbeInbox,
        *,
        signs: bool = False,
    ) -> None:
        self._fingerprint = fingerprint
        self._reply = reply
        self._signs = signs
        self.probes = probes
        self.rejected_requests = 0
        self._lock = threading.Lock()
        self._asleep: str | None = None  # why handshakes are refused now
        self._holders: OrderedDict[PeerAddress, None] = OrderedDict()

    def set_handoff_key(self, key: bytes) -> None:
        """The key this engine signs hand-offs with, given to every peer that handshakes."""
        with self._lock:
            self._reply = dataclasses.replace(self._reply, handoff_key=key)

    def respond(self, message: Message) -> Message:
        """Answer a peer's handshake or liveness probe.

        A rejection names the fields that differ, never our values: an unauthenticated
        peer learns nothing it could replay to obtain our engine metadata and regions.
        """
        if isinstance(message, Probe):
            return self.probes.answer(message)
        if not isinstance(message, HandshakeRequest):
            self.rejected_requests += 1
            return HandshakeRejected(f"expected a handshake request, got {type(message).__name__}")
        try:
            self._fingerprint.check_compatible(message.fingerprint)
        except IncompatiblePeerError as exc:
            self.rejected_requests += 1
            log_refusal(message.control, exc)
            fields = "; ".join(f"{d.field} differs" for d in exc.diffs)
            return HandshakeRejected(f"incompatible peer: {fields}")
        with self._lock:
            if self._asleep is not None:
                self.rejected_requests += 1
                return HandshakeRejected(self._asleep)
            if self._signs and not self._reply.handoff_key:
                return HandshakeRejected(NO_KEY_YET)
            self._holders[message.control] = None
            self._holders.move_to_end(message.control)
            if len(self._holders) > MAX_HOLDERS:
                self._holders.popitem(last=False)
            return self._reply

    def retire(self, reason: str) -> tuple[PeerAddress, ...]:
        """Refuse every handshake from now on with ``reason``; the peers that hold our
        regions (forgotten here: after a wake they handshake again)."""
        with self._lock:
            self._asleep = reason
            holders = tuple(self._holders)
            self._holders.clear()
            return holders

    def wake(self, reply: HandshakeReply) -> None:
        """Answer handshakes with ``reply`` (the new registration) from now on."""
        with self._lock:
            self._reply = dataclasses.replace(reply, handoff_key=self._reply.handoff_key)
            self._asleep = None
