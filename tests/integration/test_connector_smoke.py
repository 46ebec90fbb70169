"""Smoke: real vLLM schedulers for P and D, our connector, in-memory transport."""

import random

import pytest

pytest.importorskip("vllm")

from support.pd.routing import HOST, Address
from support.pd.sim_engine import SimEngine
from support.pd.sim_proxy import PDProxy, engine_extra
from support.pd.worlds import InMemoryWorld

pytestmark = pytest.mark.vllm

P_ADDRESS = Address(HOST, 6301, 61005)
D_ADDRESS = Address(HOST, 6401, 61105)


@pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
def test_requests_finish_with_identical_kv_and_all_blocks_free(read_mode: bool) -> None:
    world = InMemoryWorld()
    prefill = SimEngine(
        "P",
        "kv_producer",
        engine_extra(read_mode, P_ADDRESS),
        num_blocks=512,
        adapters_factory=world.adapters,
    )
    decode = SimEngine(
        "D",
        "kv_consumer",
        engine_extra(read_mode, D_ADDRESS),
        num_blocks=512,
        adapters_factory=world.adapters,
    )
    proxy = PDProxy(prefill, decode, read_mode, P_ADDRESS, D_ADDRESS)
    rng = random.Random(0)
    for i in range(20):
        prompt = [rng.randrange(1000) for _ in range(rng.randrange(5, 120))]
        proxy.submit(str(i), prompt, max_tokens=4)
    proxy.run()
    assert len(proxy.done) == 20
    assert decode.stats.mismatched_blocks == 0
    assert decode.stats.verified_blocks > 0
    assert not decode.stats.load_errors
    assert prefill.free_blocks() == 511
    assert decode.free_blocks() == 511
