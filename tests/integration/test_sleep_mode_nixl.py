"""Sleep mode over real NIXL (UCX) and ZMQ: two connector workers driven as vLLM 0.33's
worker drives them (``unregister_kv_caches``, the KV memory released and allocated again at
other addresses, ``restore_kv_caches``, the handshake metadata handed to the scheduler).

The released memory is kept aside, poisoned: a byte that lands in it after the unregister is
seen. Every transfer after the wake is checked byte for byte by the simulated engines. The
hooks are called directly, so the same tests run on vLLM 0.32 (which never calls them).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("vllm")

from moriio.adapters.nixl._loader import load_nixl

try:
    load_nixl(loopback=True)
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"NIXL is not installed: {exc}", allow_module_level=True)

from vllm.v1.engine import FinishReason

from support.pd.routing import prefill_params
from support.pd.sim_engine import SimEngine
from support.pd.sim_proxy import PDProxy, Workload, drive, random_workload
from support.pd.sleep import (
    retire_with_transfers_live,
    settle_and_clear_prefix_cache,
    sleep,
    wake,
)
from support.pd.worlds import NixlWorld

WORLD = NixlWorld  # the conftest's world: real NIXL agents and ZMQ sockets

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(120)]


def _renamed(workload: Workload, prefix: str) -> Workload:
    return Workload(tuple((f"{prefix}{k}", p, m) for k, p, m in workload.requests))


def _in_flight(proxy: PDProxy, engine: SimEngine) -> bool:
    """Transfers live on ``engine``, and the engines connected (a handshake settled)."""
    connected = any(e.service.ctx.peers.handshakes for e in (proxy.prefill, proxy.decode))
    return connected and engine.service.num_live > 0


def _mover_failures(proxy: PDProxy) -> int:
    return sum(e.service.ctx.counters.transfers_failed for e in (proxy.prefill, proxy.decode))


@pytest.mark.parametrize("sleeper", ["decode", "prefill"])
@pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
def test_a_worker_sleeps_with_transfers_in_flight_and_moves_identical_kv_after_its_wake(
    make_pd: Callable[..., PDProxy], read_mode: bool, sleeper: str
) -> None:
    proxy = make_pd(read_mode, num_blocks=256)
    engine: SimEngine = proxy.decode if sleeper == "decode" else proxy.prefill
    before = random_workload(seed=31 if read_mode else 32, count=16, max_len=120)
    live = retire_with_transfers_live(proxy, engine, lambda: _in_flight(proxy, engine), before)
    assert live > 0
    released = sleep(engine)
    drained = (engine.service.ctx.poster.num_inflight, engine.service.num_live)
    assert drained == (0, 0)  # nothing in flight, every transfer given up
    wake(engine, released)
    proxy.run()  # what was in flight before the sleep ends, done or failed
    settle_and_clear_prefix_cache(proxy, engine)
    assert proxy.decode.stats.mismatched_blocks == 0

    verified, failures = proxy.decode.stats.verified_blocks, _mover_failures(proxy)
    after = _renamed(random_workload(seed=33 if read_mode else 34, count=24, max_len=160), "w")
    drive(proxy, after, concurrency=8)
    for key, _, _ in after.requests:
        assert proxy.done[key].finish_reason is FinishReason.LENGTH
    assert proxy.decode.stats.verified_blocks > verified  # moved after the wake, byte-equal
    assert proxy.decode.stats.mismatched_blocks == 0
    assert _mover_failures(proxy) == failures  # no transfer failed after the wake
    assert released.untouched(), "a byte landed in KV memory after it was released"
    assert proxy.leftovers() == []
    assert engine.service.ctx.peers.generation == 2
    assert engine.service.sleep.unconfirmed == ()  # every peer holding our regions confirmed


def test_a_decode_holding_params_of_the_retired_generation_is_refused_by_name(
    make_pd: Callable[..., PDProxy], caplog: pytest.LogCaptureFixture
) -> None:
    """A prefill's hand-off from before its sleep names registration generation 1; after the
    wake its blocks are gone, and the decode refuses the read naming the generation."""
    proxy = make_pd(True, num_blocks=128)
    prefill, decode = proxy.prefill, proxy.decode
    prompt = list(range(40))
    prefill.add("p-stale", prompt, 1, prefill_params("stale-transfer"))
    for _ in range(20):
        if "p-stale" in prefill.outputs:
            break
        prefill.step()
    returned = dict(prefill.outputs["p-stale"].kv_transfer_params)
    assert returned["remote_registration_generation"] == 1

    released = sleep(prefill)
    wake(prefill, released)
    with caplog.at_level("WARNING"):
        decode.add("d-stale", prompt, 2, returned)
        for _ in range(50):
            if "d-stale" in decode.outputs:
                break
            decode.step()
    # The hold ordered before the sleep reached the worker after the wake: the refused
    # decode's release frees it.
    settle_and_clear_prefix_cache(proxy, prefill)
    counters = decode.service.ctx.counters
    assert counters.failures_by_kind.get("retired_generation") == 1
    assert "retired registration generation 1" in caplog.text
    assert decode.stats.mismatched_blocks == 0
    assert released.untouched()

    # A hand-off made after the wake names generation 2 and moves.
    fresh = list(range(100, 140))
    prefill.add("p-fresh", fresh, 1, prefill_params("fresh-transfer"))
    for _ in range(20):
        if "p-fresh" in prefill.outputs:
            break
        prefill.step()
    params = dict(prefill.outputs["p-fresh"].kv_transfer_params)
    assert params["remote_registration_generation"] == 2
    verified = decode.stats.verified_blocks
    decode.add("d-fresh", fresh, 2, params)
    proxy.run()
    assert decode.outputs["d-fresh"].finish_reason is FinishReason.LENGTH
    assert decode.stats.verified_blocks > verified
    assert decode.stats.mismatched_blocks == 0
