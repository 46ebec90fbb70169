"""Asynchronous READ loads and background handshakes, on vLLM's real schedulers.

In ``load_mode`` async the decode request waits in ``WAITING_FOR_REMOTE_KVS`` while its reads
run, is scheduled only once the worker reports them finished, and a failed load is reported
(blocks invalid, request failed or recomputed) only when its transfer is terminal. A read to a
peer that never answers its handshake fails on its own, without holding up other requests.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine import FinishReason
from vllm.v1.request import RequestStatus

from moriio.testing.handoffs import signed_params
from support.pd.sim_proxy import PDProxy, build_pd
from support.pd.worlds import InMemoryWorld, NixlWorld, World, free_tcp_port

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(90)]

PROMPT = list(range(1, 70))  # four full blocks and one partial
# Back-off long enough that a later request surely finds the dead peer still remembered.
DEAD_PEER_EXTRA = {
    "handshake_timeout": 10.0,  # outlasts the good request on a loaded machine
    "handshake_retry_after": 60.0,
    "handshake_max_retry_after": 60.0,
}
LOAD_MODES = pytest.mark.parametrize("load_mode", ["async", "layerwise"])


@pytest.fixture
def make_pd() -> Iterator[Callable[..., PDProxy]]:
    built: list[tuple[World, PDProxy]] = []

    def make(world: World, load_mode: str, **kwargs: object) -> PDProxy:
        extra = {"load_mode": load_mode, **kwargs.pop("extra", {})}  # type: ignore[dict-item]
        proxy = build_pd(world, True, extra=extra, **kwargs)  # type: ignore[arg-type]
        built.append((world, proxy))
        return proxy

    yield make
    for world, proxy in built:
        world.close()  # a NIXL pump stops before its agents close
        proxy.close()


def _status(proxy: PDProxy, key: str) -> RequestStatus | None:
    request = proxy.decode.scheduler.requests.get(proxy.decode_ids[key])
    return None if request is None else request.status


def _prefill(proxy: PDProxy, key: str, prompt: list[int], max_tokens: int = 3) -> None:
    proxy.submit(key, prompt, max_tokens)
    for _ in range(20):
        if key in proxy.prefill_done:
            return
        proxy.step_prefill()
    raise AssertionError(f"prefill of {key} not done")


DEAD_PEER_KEY = secrets.token_bytes(32)


def _dead_peer_params(transfer_id: str, port: int) -> dict[str, object]:
    """Params a prefill signed (with a key nothing here verifies: it never answers)."""
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": transfer_id,
        "remote_block_ids": [1, 2, 3],
        "remote_host": "127.0.0.1",  # trusted: our own host
        "remote_handshake_port": port,
        "remote_notify_port": port,
        "remote_tp_size": 1,
    }
    return signed_params(params, DEAD_PEER_KEY, "dead#0")


def _assert_clean(proxy: PDProxy) -> None:
    assert proxy.leftovers() == []
    assert proxy.decode.stats.mismatched_blocks == 0


def test_async_read_waits_outside_the_forward_and_is_scheduled_once_landed(
    world: InMemoryWorld, make_pd: Callable[..., PDProxy]
) -> None:
    proxy = make_pd(world, "async", num_blocks=256)
    proxy.decode.transfer_engine.complete_after_polls = 3  # the reads span a few pumps
    _prefill(proxy, "a", PROMPT)
    proxy.step_decode()
    assert _status(proxy, "a") == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert proxy.decode.scheduler.requests[proxy.decode_ids["a"]].num_output_tokens == 0
    for _ in range(50):
        if _status(proxy, "a") != RequestStatus.WAITING_FOR_REMOTE_KVS:
            break
        proxy.step_decode()
    assert proxy.decode.finished_recving == Counter({proxy.decode_ids["a"]: 1})
    proxy.run(max_steps=50)
    assert proxy.done["a"].finish_reason == FinishReason.LENGTH
    assert proxy.decode.stats.verified_blocks == 5 * 2  # every loaded block, both layers
    assert proxy.prefill.finished_sending == Counter({"p-a": 1})  # released exactly once
    _assert_clean(proxy)


def test_layerwise_read_runs_in_the_step_its_reads_are_posted(
    world: InMemoryWorld, make_pd: Callable[..., PDProxy]
) -> None:
    proxy = make_pd(world, "layerwise", num_blocks=256)
    proxy.decode.transfer_engine.complete_after_polls = 3
    _prefill(proxy, "a", PROMPT)
    proxy.step_decode()
    assert _status(proxy, "a") == RequestStatus.RUNNING
    assert not proxy.decode.finished_recving  # nothing waited outside the forward
    proxy.run(max_steps=50)
    assert proxy.done["a"].finish_reason == FinishReason.LENGTH
    assert proxy.decode.stats.verified_blocks == 5 * 2
    assert proxy.prefill.finished_sending == Counter({"p-a": 1})
    _assert_clean(proxy)


@LOAD_MODES
@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_failed_read_is_reported_once_terminal_and_frees_both_sides(
    world: InMemoryWorld, make_pd: Callable[..., PDProxy], load_mode: str, policy: str
) -> None:
    proxy = make_pd(world, load_mode, num_blocks=256, kv_load_failure_policy=policy)
    engine = proxy.decode.transfer_engine
    engine.complete_after_polls = 4  # the other layer's batch stays in flight a while
    _prefill(proxy, "a", PROMPT)
    engine.inject_failures(1)  # the first layer's batch fails at once
    proxy.step_decode()
    tid = proxy.transfer_ids["a"]
    poster = proxy.decode.service.ctx.poster
    for _ in range(50):
        if load_mode == "async" and poster.inflight(tid):
            # Quarantined: not reported while a batch may still write into the blocks.
            assert _status(proxy, "a") == RequestStatus.WAITING_FOR_REMOTE_KVS
            assert not proxy.decode.stats.load_errors
        if "a" in proxy.done:
            break
        proxy.step_decode()
    proxy.run(max_steps=100)
    assert proxy.decode.stats.load_errors
    expected = FinishReason.ERROR if policy == "fail" else FinishReason.LENGTH
    assert proxy.done["a"].finish_reason == expected
    assert proxy.prefill.finished_sending == Counter({"p-a": 1})  # released exactly once
    _assert_clean(proxy)


def test_a_request_aborted_while_its_read_runs_frees_its_blocks_when_the_read_ends(
    world: InMemoryWorld, make_pd: Callable[..., PDProxy]
) -> None:
    proxy = make_pd(world, "async", num_blocks=256)
    engine = proxy.decode.transfer_engine
    engine.complete_after_polls = 5
    _prefill(proxy, "a", PROMPT)
    proxy.step_decode()
    assert _status(proxy, "a") == RequestStatus.WAITING_FOR_REMOTE_KVS
    tid = proxy.transfer_ids["a"]
    assert proxy.decode.service.ctx.poster.inflight(tid)
    free_before = proxy.decode.free_blocks()
    proxy.abort_decode("a")
    # The blocks stay allocated while the read may still write into them.
    assert proxy.decode.free_blocks() == free_before
    proxy.run(max_steps=100)
    assert proxy.decode_ids["a"] not in proxy.decode.scheduler.requests
    assert proxy.decode.finished_recving == Counter({proxy.decode_ids["a"]: 1})
    assert proxy.prefill.finished_sending == Counter({"p-a": 1})
    _assert_clean(proxy)


def test_a_peer_that_never_answers_delays_no_other_request(
    make_pd: Callable[..., PDProxy],
) -> None:
    """Three requests name a closed port on a trusted host; a good request sent with them
    finishes while they still wait for their handshake, then they fail on their own, are
    remembered (no second handshake), and no block is left allocated."""
    world = NixlWorld()
    proxy = make_pd(world, "async", num_blocks=256, extra=DEAD_PEER_EXTRA)
    decode = proxy.decode
    _prefill(proxy, "good", PROMPT, max_tokens=4)
    closed = free_tcp_port()  # nothing listens there
    bad_ids = [f"d-bad-{i}" for i in range(3)]
    for i, rid in enumerate(bad_ids):
        params = _dead_peer_params(f"tx-bad-{i}", closed)
        decode.add(rid, [7 + i] * 40, 2, params)
    finished_while_bad_waited = False
    for _ in range(2000):  # the good request's read runs in real time, beside the bad ones
        proxy.step_decode()
        time.sleep(0.001)
        if "good" in proxy.done:
            waiting = [decode.scheduler.requests[r].status for r in bad_ids]
            finished_while_bad_waited = waiting == [RequestStatus.WAITING_FOR_REMOTE_KVS] * 3
            break
    assert proxy.done["good"].finish_reason == FinishReason.LENGTH
    assert finished_while_bad_waited
    # The bad requests end on their own, once their handshake gives up.
    for _ in range(8000):
        if all(r in decode.outputs for r in bad_ids):
            break
        decode.step()
        time.sleep(0.005)  # the handshake times out in real time
    assert {decode.outputs[r].finish_reason for r in bad_ids} == {FinishReason.ERROR}
    peers = decode.service.ctx.peers
    assert peers.handshake_failures == 1  # one handshake for the three, then backed off
    assert peers.num_pending_handshakes == 0
    # A later request to the same dead peer fails at once, without a new handshake.
    params = _dead_peer_params("tx-bad-later", closed)
    decode.add("d-bad-later", [99] * 40, 2, params)
    for _ in range(3):
        decode.step()
    assert decode.outputs["d-bad-later"].finish_reason == FinishReason.ERROR
    assert peers.handshake_failures == 1
    assert decode.service.num_live == 0
    proxy.run(max_steps=100)  # the prefill takes in the good request's release
    assert proxy.prefill.finished_sending == Counter({"p-good": 1})
    _assert_clean(proxy)
