"""Scale: hundreds of requests through real vLLM schedulers for P and D over the in-memory fake.

Every request finishes, the decode's KV bytes equal the prefill's, and both engines end with
every block free and nothing tracked by the connector.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine import FinishReason

from support.pd.sim_proxy import PDProxy, build_pd, drive, random_workload
from support.pd.worlds import InMemoryWorld

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(120)]

NUM_REQUESTS = 500
CONCURRENCY = 64


def _assert_clean_run(proxy: PDProxy, expected: int) -> None:
    assert len(proxy.done) == expected
    reasons = {output.finish_reason for output in proxy.done.values()}
    assert reasons == {FinishReason.LENGTH}
    decode = proxy.decode
    assert decode.stats.mismatched_blocks == 0
    assert decode.stats.verified_blocks > 0
    assert not decode.stats.load_errors
    assert proxy.leftovers() == []
    assert proxy.prefill.free_blocks() == proxy.prefill.num_blocks - 1
    assert proxy.decode.free_blocks() == proxy.decode.num_blocks - 1


@pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
@pytest.mark.parametrize(
    ("complete_after_polls", "jitter_polls"), [(0, 0), (2, 6)], ids=["instant", "polled"]
)
def test_many_requests_move_identical_kv_and_free_every_block(
    world: InMemoryWorld, read_mode: bool, complete_after_polls: int, jitter_polls: int
) -> None:
    proxy = build_pd(world, read_mode, num_blocks=4096)
    try:
        for engine in (proxy.prefill, proxy.decode):  # batches stay in flight for some polls
            engine.transfer_engine.complete_after_polls = complete_after_polls
            engine.transfer_engine.jitter_polls = jitter_polls
        workload = random_workload(seed=1 if read_mode else 2, count=NUM_REQUESTS)
        drive(proxy, workload, concurrency=CONCURRENCY)
        _assert_clean_run(proxy, NUM_REQUESTS)
        # Repeated prompts hit the prefix cache on both engines.
        assert proxy.prefill.stats.prefix_cache_hits > 0
        assert proxy.decode.stats.prefix_cache_hits > 0
        mover = (proxy.decode if read_mode else proxy.prefill).transfer_stats()
        assert mover["transfers"] > NUM_REQUESTS // 2
        assert mover["succeeded"] == mover["transfers"]
        assert mover["failed"] == 0
        assert mover["bytes"] > 0
        # Every hand-off was released exactly once, by the consumer (not by a lease).
        assert proxy.prefill.finished_sending.total() == NUM_REQUESTS
        assert proxy.prefill.transfer_stats()["expired_leases"] == 0
    finally:
        proxy.close()


@pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
def test_prefix_cache_hits_on_both_engines(world: InMemoryWorld, read_mode: bool) -> None:
    proxy = build_pd(world, read_mode, num_blocks=1024)
    try:
        prompt = list(range(100, 100 + 5 * 16 + 3))
        for i in range(3):
            proxy.submit(f"same-{i}", prompt, max_tokens=2)
            proxy.run()
        _assert_clean_run(proxy, 3)
        assert proxy.prefill.stats.prefix_cache_hits >= 2 * 5 * 16
        assert proxy.decode.stats.prefix_cache_hits >= 2 * 5 * 16
    finally:
        proxy.close()


@pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
def test_router_style_request_ids_carry_the_peer_addresses(
    world: InMemoryWorld, read_mode: bool
) -> None:
    proxy = build_pd(world, read_mode, num_blocks=1024, router_style=True)
    try:
        drive(proxy, random_workload(seed=3, count=40, max_len=120), concurrency=16)
        _assert_clean_run(proxy, 40)
        assert all(rid.startswith("___prefill_addr_") for rid in proxy.decode_ids.values())
    finally:
        proxy.close()


@pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
def test_verification_detects_wrong_bytes(world: InMemoryWorld, read_mode: bool) -> None:
    """Negative control: a prefill writing other KV makes the decode's check fail."""
    proxy = build_pd(world, read_mode, num_blocks=1024)
    try:
        proxy.prefill.write_salt = 1
        drive(proxy, random_workload(seed=4, count=10, min_len=40, max_len=120), concurrency=10)
        assert len(proxy.done) == 10
        assert proxy.decode.stats.mismatched_blocks > 0
        assert proxy.leftovers() == []
    finally:
        proxy.close()


@pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
def test_small_block_pools_preempt_and_still_free_every_block(
    world: InMemoryWorld, read_mode: bool
) -> None:
    proxy = build_pd(world, read_mode, num_blocks=40, max_num_batched_tokens=256)
    try:
        workload = random_workload(seed=5, count=200, max_tokens=16)
        drive(proxy, workload, concurrency=CONCURRENCY)
        assert proxy.decode.stats.preemptions > 0  # the pools really ran out
        _assert_clean_run(proxy, 200)
    finally:
        proxy.close()
