"""Malformed kv_transfer_params from a client never crash the engine: the request runs locally."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

from support.pd.sim_engine import SimEngine
from support.pd.sim_proxy import engine_extra
from support.pd.worlds import InMemoryWorld

pytestmark = pytest.mark.vllm


@pytest.fixture
def decode() -> Iterator[SimEngine]:
    world = InMemoryWorld()
    engine = SimEngine(
        "D",
        "kv_consumer",
        engine_extra(True, world.address()),
        num_blocks=256,
        adapters_factory=world.adapters_factory,
    )
    yield engine
    engine.close()


@pytest.mark.parametrize(
    "params",
    [
        {"do_remote_prefill": True, "remote_host": "127.0.0.1"},  # no transfer_id
        {"do_remote_prefill": "yes", "transfer_id": "tx-1"},  # not a bool
        {
            "do_remote_prefill": True,
            "transfer_id": "tx-2",
            "remote_host": "127.0.0.1",
            "remote_handshake_port": 70000,  # not a port
            "remote_notify_port": 61005,
            "remote_block_ids": [[1, 2]],
        },
    ],
    ids=["missing-transfer-id", "flag-not-bool", "bad-port"],
)
def test_invalid_params_run_the_request_locally_and_are_counted(
    decode: SimEngine, params: dict[str, object]
) -> None:
    decode.add("r-1", list(range(1, 40)), 3, params)
    for _ in range(20):
        if not decode.busy():
            break
        decode.step()
    assert not decode.busy()
    assert "r-1" in decode.outputs
    side = decode.connector.scheduler_side
    assert side is not None
    assert side.rejected_params == 1
    assert decode.transfer_stats()["rejected_params"] == 1  # reported to vLLM's stats
    assert decode.service.ctx.counters.transfers_started == 0
    assert decode.free_blocks() == 255
