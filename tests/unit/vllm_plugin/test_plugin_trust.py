"""Control messages go only to trusted hosts: a refused send is counted, never silent. A
release on a request's behalf goes only to a producer whose hand-off the request verified."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine import FinishReason

from moriio.domain.protocol.messages import Release
from moriio.testing.handoffs import signed_params
from support.pd.sim_engine import SimEngine
from support.pd.sim_proxy import engine_extra
from support.pd.worlds import InMemoryWorld

pytestmark = pytest.mark.vllm

UNTRUSTED = "203.0.113.9"  # TEST-NET-3


def _params(host: str, tid: str) -> dict[str, Any]:
    """Signed params (by a key no test engine holds: nothing here gets to verify them)."""
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": tid,
        "remote_block_ids": [[3, 4, 5]],
        "remote_host": host,
        "remote_handshake_port": 7001,
        "remote_notify_port": 7002,
        "remote_tp_size": 1,
    }
    return signed_params(params, secrets.token_bytes(32), "p#0")


@pytest.fixture
def world() -> InMemoryWorld:
    return InMemoryWorld()


def _decode(world: InMemoryWorld, **extra: Any) -> Iterator[SimEngine]:
    engine = SimEngine(
        "D",
        "kv_consumer",
        engine_extra(True, world.address(), **extra),
        num_blocks=64,
        adapters_factory=world.adapters_factory,
    )
    yield engine
    engine.close()


@pytest.fixture
def decode(world: InMemoryWorld) -> Iterator[SimEngine]:
    yield from _decode(world)


@pytest.fixture
def trusting_decode(world: InMemoryWorld) -> Iterator[SimEngine]:
    yield from _decode(world, trusted_remote_hosts=[UNTRUSTED])


def _releases(engine: SimEngine) -> list[Release]:
    return [s.message for s in engine.channel.sent if isinstance(s.message, Release)]


def test_an_abort_frees_no_hand_off_it_could_not_verify(
    decode: SimEngine, trusting_decode: SimEngine
) -> None:
    """A request aborted before it loaded frees its producer's blocks only once its hand-off
    verified against the producer's key: params alone free nothing. An untrusted host is not
    dialled; a trusted one is asked for its key as a read would ask it (nothing answers
    here: the producer reclaims the blocks at its lease)."""
    for engine, dialled in ((decode, False), (trusting_decode, True)):
        engine.add("r", list(range(1, 40)), 2, _params(UNTRUSTED, "tx-r"))
        engine.abort(["r"])
        engine.step()
        assert _releases(engine) == []
        handshakes = [s for s in engine.channel.requests if s.peer.host == UNTRUSTED]
        assert len(handshakes) == int(dialled)
        assert engine.transfer_stats().get("messages_refused", 0) == 0
        for _ in range(3):
            engine.step()
        assert _releases(engine) == []


def test_read_from_an_untrusted_host_is_refused_as_a_load_error(decode: SimEngine) -> None:
    decode.add("r", list(range(1, 40)), 2, _params(UNTRUSTED, "tx-r"))
    for _ in range(3):
        decode.step()
    assert decode.outputs["r"].finish_reason == FinishReason.ERROR
    assert decode.channel.requests == []  # no handshake was attempted
    assert _releases(decode) == []
    stats = decode.transfer_stats()
    assert stats["handshake_failures"] == 1
    assert stats["failed_handshake"] == 1
    # Nothing else is sent: an unverified hand-off is not released on the request's behalf.
    assert stats.get("messages_refused", 0) == 0
    assert decode.leftovers() == []
