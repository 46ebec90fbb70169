"""Control messages go only to trusted hosts: a refused send is counted, never silent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine import FinishReason

from moriio.domain.protocol.messages import Release
from support.pd.sim_engine import SimEngine
from support.pd.sim_proxy import engine_extra
from support.pd.worlds import InMemoryWorld

pytestmark = pytest.mark.vllm

UNTRUSTED = "203.0.113.9"  # TEST-NET-3


def _params(host: str, tid: str) -> dict[str, Any]:
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": tid,
        "remote_block_ids": [[3, 4, 5]],
        "remote_host": host,
        "remote_handshake_port": 7001,
        "remote_notify_port": 7002,
        "remote_tp_size": 1,
    }


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


def test_release_to_an_untrusted_host_is_refused_and_counted(decode: SimEngine) -> None:
    decode.add("r", list(range(1, 40)), 2, _params(UNTRUSTED, "tx-r"))
    decode.abort(["r"])  # never loaded: the producer's blocks must be released
    decode.step()
    assert _releases(decode) == []  # refused before anything was sent
    assert decode.transfer_stats()["messages_refused"] == 1
    assert decode.leftovers() == []


def test_release_to_a_trusted_host_is_sent(trusting_decode: SimEngine) -> None:
    """Control: the same release goes out once the host is listed in trusted_remote_hosts."""
    trusting_decode.add("r", list(range(1, 40)), 2, _params(UNTRUSTED, "tx-r"))
    trusting_decode.abort(["r"])
    trusting_decode.step()
    assert [m.transfer_id for m in _releases(trusting_decode)] == ["tx-r"]
    assert trusting_decode.transfer_stats().get("messages_refused", 0) == 0


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
    assert stats["messages_refused"] == 1
    assert decode.leftovers() == []
