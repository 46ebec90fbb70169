"""A rejected handshake tells the requester which fields differ, never our values."""

from __future__ import annotations

import dataclasses
import random

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.adapters.inmemory import InMemoryFabric, InMemoryNetwork
from moriio.domain.messages import HandshakeRejected, HandshakeReply, HandshakeRequest, Release
from moriio.domain.orders import TransferMode
from moriio.domain.peers import PeerDirectory
from moriio.sim.config import SimClock
from moriio.sim.memory import KVMemory
from moriio.sim.stack import Endpoint, Timing, build_stack


def _peers_and_request() -> tuple[PeerDirectory, HandshakeRequest]:
    clock = SimClock()
    stack = build_stack(
        name="producer#0",
        mode=TransferMode.READ,
        is_producer=True,
        endpoint=Endpoint(handshake_port=7000, notify_port=7100),
        memory=KVMemory(2, 16, 4),
        clock=clock,
        fabric=InMemoryFabric(),
        network=InMemoryNetwork(clock),
        timing=Timing(),
        rng=random.Random(1),
        engine_plan=EngineFaultPlan(),
        channel_plan=ChannelFaultPlan(),
    )
    peers = stack.service.ctx.peers
    return peers, peers._request  # a request exactly like ours, to vary


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
