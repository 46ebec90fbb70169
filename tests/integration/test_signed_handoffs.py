"""Signed hand-offs through vLLM's real scheduler and our connector in both roles, routed as
vLLM's toy proxy routes them (it copies only the engine id, the block ids and the transfer id
from the prefill's answer): a decode loads a hand-off only for the prompt it was computed
for, from the prefill that computed it; every refusal is an error for that request alone
(``kv_load_failure_policy`` fail) and is counted by name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine import FinishReason

from support.pd.routing import new_transfer_id, prefill_params, write_decode_params
from support.pd.sim_proxy import PDProxy, build_pd
from support.pd.worlds import InMemoryWorld

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

PROMPT = list(range(1, 70))  # four full blocks and a partial one
OTHER = list(range(101, 170))
COPIED = ("remote_engine_id", "remote_block_ids", "transfer_id")  # what the toy proxy copies


@pytest.fixture
def read_pd() -> Iterator[PDProxy]:
    world = InMemoryWorld()
    proxy = build_pd(world, True, num_blocks=256)
    yield proxy
    proxy.close()


def _hand_off(proxy: PDProxy) -> dict[str, Any]:
    """``PROMPT``'s prefill; its hand-off as the toy proxy forwards it to a decode."""
    p_id = "p-genuine"
    proxy.prefill.add(p_id, PROMPT, 1, prefill_params(new_transfer_id()))
    for _ in range(50):
        for output in proxy.prefill.step():
            if output.request_id == p_id:
                returned = dict(output.kv_transfer_params)
                forwarded = {k: returned[k] for k in COPIED}
                address = proxy.prefill_address
                return {
                    **forwarded,
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_host": address.host,
                    "remote_handshake_port": address.handshake_port,
                    "remote_notify_port": address.notify_port,
                    "remote_tp_size": 1,
                }
    raise AssertionError("the prefill never finished")


def _decode(
    proxy: PDProxy, rid: str, prompt: list[int], params: dict[str, Any], pause: float = 0.0
) -> Any:
    """``rid``'s output; ``pause`` seconds between steps leave the peer pump its turn."""
    proxy.decode.add(rid, prompt, 2, dict(params))  # (the engine marks its copy consumed)
    for _ in range(400):
        proxy.step()
        time.sleep(pause)
        if rid in proxy.decode.outputs:
            return proxy.decode.outputs[rid]
    raise AssertionError(f"{rid} never finished")


def test_only_the_prompt_a_hand_off_was_computed_for_loads_it(read_pd: PDProxy) -> None:
    genuine = _hand_off(read_pd)
    engine_id = genuine["remote_engine_id"].partition("#")[0]
    attacks: dict[str, tuple[list[int], dict[str, Any]]] = {
        "prompt_mismatch": (OTHER, genuine),  # replayed for another prompt
        "unsigned": (  # guessed block ids under the prefill's engine id
            OTHER,
            {**genuine, "remote_engine_id": engine_id, "remote_block_ids": [[1, 2, 3, 4, 5]]},
        ),
        "bad_tag": (  # the genuine signature over other blocks
            PROMPT,
            {**genuine, "remote_block_ids": [[b + 1 for b in genuine["remote_block_ids"][0]]]},
        ),
    }
    for kind, (prompt, params) in attacks.items():
        assert _decode(read_pd, f"d-{kind}", prompt, params).finish_reason == FinishReason.ERROR
    stats = read_pd.decode.transfer_stats()
    assert stats["handoffs_refused"] == 3
    assert {k: stats[f"failed_{k}"] for k in attacks} == dict.fromkeys(attacks, 1)
    assert read_pd.decode.stats.verified_blocks == 0  # nothing was loaded for them
    assert read_pd.decode.stats.mismatched_blocks == 0
    assert read_pd.prefill.leftovers() != []  # nor freed: the hand-off is still held
    # The request it was computed for loads it, with the right bytes, and frees it.
    assert _decode(read_pd, "d-genuine", PROMPT, genuine).finish_reason == FinishReason.LENGTH
    assert read_pd.decode.stats.verified_blocks > 0
    assert read_pd.decode.stats.mismatched_blocks == 0
    read_pd.run()
    assert read_pd.leftovers() == []


def test_a_write_announced_for_another_prompt_fails_only_that_request() -> None:
    """WRITE: a decode request with another prompt under a prefill's transfer id is refused
    by the prefill; the request for the prompt it computed, sent next (vLLM's scheduler then
    ends the refused one in the same step as it announces this one), is pushed into. (Behind
    ``vllm serve`` the refused request's error also releases the transfer: see
    docs/security.md.)"""
    world = InMemoryWorld()
    proxy = build_pd(world, False, num_blocks=256)
    try:
        tid = new_transfer_id()
        proxy.prefill.add("p-genuine", PROMPT, 1, prefill_params(tid, proxy.decode_address))
        while "p-genuine" not in proxy.prefill.outputs:  # computed: its KV waits for the decode
            proxy.step()
        params = write_decode_params(tid, proxy.prefill_address)
        other = _decode(proxy, "d-other", OTHER, params, pause=0.001)
        assert other.finish_reason == FinishReason.ERROR
        for _ in range(50):  # the prefill's worker stats reach vLLM's logger at its next steps
            if proxy.prefill.transfer_stats().get("failed_prompt_mismatch"):
                break
            proxy.prefill.step()
        assert proxy.prefill.transfer_stats()["failed_prompt_mismatch"] == 1
        genuine = _decode(proxy, "d-genuine", PROMPT, params, pause=0.001)
        assert genuine.finish_reason == FinishReason.LENGTH
        assert proxy.decode.stats.verified_blocks > 0
        assert proxy.decode.stats.mismatched_blocks == 0
        proxy.run()
        assert proxy.leftovers() == []
    finally:
        proxy.close()
