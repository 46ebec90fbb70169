"""A rejected handshake tells the requester which fields differ, never our values."""

from __future__ import annotations

import dataclasses

from moriio.domain.protocol.messages import (
    HandshakeRejected,
    HandshakeReply,
    HandshakeRequest,
    Release,
)
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.peers import PeerDirectory
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from support.worker_stacks import worker_stack


def _peers_and_request() -> tuple[PeerDirectory, HandshakeRequest]:
    clock = FakeClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    stack, _ = worker_stack("producer#0", True, TransferMode.READ, clock, fabric, net)
    peers = stack.service.ctx.peers
    return peers, peers._client.request  # a request exactly like ours, to vary


def test_a_rejection_names_fields_but_reveals_no_values() -> None:
    peers, ours = _peers_and_request()
    fp = ours.fingerprint
    probe = dataclasses.replace(
        ours,
        fingerprint=dataclasses.replace(fp, model_name="guess", dtype="guess-dtype", block_size=7),
        engine_metadata=b"attacker",
    )
    answer = peers.respond(probe)
    assert isinstance(answer, HandshakeRejected)
    assert answer.reason == (
        "incompatible peer: model_name differs; dtype differs; block_size differs"
    )
    for secret in (fp.model_name, fp.dtype, str(fp.block_size)):
        assert secret not in answer.reason
    assert peers.rejected_requests == 1


def test_a_matching_fingerprint_gets_the_reply_and_other_messages_nothing() -> None:
    peers, ours = _peers_and_request()
    assert isinstance(peers.respond(ours), HandshakeReply)
    other = peers.respond(Release("t", 1))
    assert isinstance(other, HandshakeRejected)
    assert "expected a handshake request" in other.reason
