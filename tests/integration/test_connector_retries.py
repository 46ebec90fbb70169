"""A router that retries a prefill under the same ``transfer_id`` (llm-d does on a 502/503/504)
gets a hand-off from the retry, through the real vLLM scheduler with the connector on both
engines (in-memory ports that copy real bytes), and nothing stays held."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine import FinishReason

from support.pd.routing import new_transfer_id, prefill_params, write_decode_params
from support.pd.sim_proxy import PDProxy, build_pd
from support.pd.worlds import InMemoryWorld

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

SHORT_LEASE = {"transfer_timeout": 0.5, "defer_timeout": 1.0, "clock_skew_allowance": 0.1}
PROMPT = list(range(1, 70))


def _route(proxy: PDProxy, key: str, prefill_id: str, transfer_id: str) -> None:
    """Send the prefill leg ``prefill_id`` as the proxy's request ``key`` (its decode follows
    as the proxy routes it)."""
    proxy.transfer_ids[key] = transfer_id
    proxy.prefill_ids[key], proxy.decode_ids[key] = prefill_id, f"d-{key}"
    proxy._key_of[f"d-{key}"] = key
    peer = None if proxy.read_mode else proxy.decode_address
    proxy.prefill.add(prefill_id, PROMPT, 1, prefill_params(transfer_id, peer))
    proxy.pending[prefill_id] = (key, PROMPT, 2)


def test_a_read_retry_is_read_under_its_own_id_and_the_orphan_freed_at_its_lease(
    world: InMemoryWorld,
) -> None:
    proxy = build_pd(world, True, num_blocks=512, extra=SHORT_LEASE)
    try:
        tid = new_transfer_id()
        # The first attempt finishes, but its answer never reaches the router.
        proxy.prefill.add("p-first", PROMPT, 1, prefill_params(tid))
        for _ in range(20):
            if any(o.request_id == "p-first" for o in proxy.prefill.step()):
                break
        _route(proxy, "a", "p-retry", tid)
        proxy.run(max_steps=3000, pause=0.002)
        returned = proxy.prefill_done["a"].kv_transfer_params
        assert returned["transfer_id"].startswith(f"{tid}~")
        assert proxy.done["a"].finish_reason == FinishReason.LENGTH
        assert proxy.decode.stats.verified_blocks > 0
        assert proxy.decode.stats.mismatched_blocks == 0
        assert proxy.prefill.finished_sending["p-retry"] == 1  # released by its decode
        assert proxy.prefill.transfer_stats()["expired_leases"] == 1  # the orphan
        assert proxy.leftovers() == []
    finally:
        proxy.close()


def test_a_write_retry_takes_the_push_over_from_an_attempt_not_pushed_yet(
    world: InMemoryWorld,
) -> None:
    proxy = build_pd(world, False, num_blocks=512, extra=SHORT_LEASE)
    try:
        tid = new_transfer_id()
        proxy.decode.add("d-a", PROMPT, 2, write_decode_params(tid, proxy.prefill_address))
        # Both attempts get blocks in one step: the first has not been ordered to push.
        proxy.prefill.add("p-first", PROMPT, 1, prefill_params(tid, proxy.decode_address))
        _route(proxy, "a", "p-retry", tid)
        proxy.run(max_steps=3000, pause=0.002)
        first = proxy.prefill.outputs["p-first"]
        assert first.finish_reason == FinishReason.LENGTH
        assert first.kv_transfer_params is None  # no hand-off of its own, and no cancel
        returned = proxy.prefill_done["a"].kv_transfer_params
        assert returned is not None
        assert returned["transfer_id"] == tid
        assert proxy.done["a"].finish_reason == FinishReason.LENGTH
        assert proxy.decode.stats.verified_blocks > 0
        assert proxy.decode.stats.mismatched_blocks == 0
        assert proxy.prefill.finished_sending == {"p-retry": 1}
        assert proxy.leftovers() == []
    finally:
        proxy.close()
