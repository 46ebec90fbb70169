"""The answering half of handshakes: what a peer handshaking with us (or probing us) gets."""

from __future__ import annotations

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


class HandshakeResponder:
    """Answers handshake requests with our reply, or a rejection that names only the fields
    that differ; liveness probes go to :attr:`probes`. Runs on listener threads."""

    def __init__(self, fingerprint: Fingerprint, reply: HandshakeReply, probes: ProbeInbox) -> None:
        self._fingerprint = fingerprint
        self._reply = reply
        self.probes = probes
        self.rejected_requests = 0

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
        return self._reply
