"""An engine killed mid-traffic in a real 1P1D ``vllm serve`` deployment behind ``moriio router``.

Per transfer mode and victim: a wave of long requests is in flight, and the decode engine has
some of them, when the prefill or the decode engine is SIGKILLed (no shutdown). With the
default transfer and lease timeouts (30 s, 60 s) and a 2 s liveness bound:

* every client of the wave gets its answer or an error within 5 s of the kill: the survivor
  learns of the death through liveness probes, not by waiting out its timeouts;
* with no traffic at all, the surviving engine holds no block within 5 s of the kill;
* the router stops routing to the silent engine and refuses a request at once (503);
* a fresh engine takes the dead one's ports; the next wave through it equals a single plain
  engine's output, and both engines end with no block held.

One deployment per mode serves both victims: the second kill hits a deployment that already
recovered from the first.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import aiohttp
import pytest

from moriio.router.registry import DEFAULT_STALE_AFTER_S
from moriio_tools.harness import (
    Completion,
    Deployment,
    EngineSlot,
    ServeDemoConfig,
    build_prompts,
    complete,
    held_blocks,
    run_batch,
    total,
)
from support.llama_reference import LlamaReference, Reference
from support.prompt_kv import assert_prompt_kv_over_the_wire, decode_metrics, decode_sources

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

LIVENESS = {"liveness_timeout": 2.0}  # every other timeout keeps its default
DEAD_PEER_BOUND_S = 5.0  # clients answered, and the survivor free, within this of a kill
SLACK_S = 10.0  # scheduling noise on a busy 2-core machine
RECLAIM_S = 30.0  # after the restart: both engines free within this
WAVE_BOUND_S = 60.0  # the wave's clients never wait longer than this in all
CRASH_WAVE = 8
CRASH_PROMPT_LEN = 900
CRASH_MAX_TOKENS = 32
RECOVERY = 6
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def reference(llama_reference: LlamaReference) -> Callable[[str], Reference]:
    """Each victim's recovery prompts with their outputs: prompts of its own, so that the
    decode's prefix cache holds none of them when the other victim's test ran first."""
    assert ServeDemoConfig().max_tokens == MAX_TOKENS

    def of(victim: str) -> Reference:
        model_dir, prompts, expected = llama_reference.prompt_set(f"crash-{victim}")
        assert len(prompts) == RECOVERY
        return model_dir, prompts, expected

    return of


@pytest.fixture(scope="module")
def deployments(
    llama_reference: LlamaReference, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Deployment]]:
    """One deployment per mode, started on first use: the second victim's test runs on the
    deployment that recovered from the first one's kill."""
    started: dict[str, Deployment] = {}

    def of(mode: str) -> Deployment:
        if mode not in started:
            for other in started.values():
                other.stop()  # one deployment at a time on the machine
            log_dir = tmp_path_factory.mktemp(f"crash-{mode}")
            deployment = Deployment(
                llama_reference.model_dir, mode, log_dir, connector_extra=dict(LIVENESS)
            )
            started[mode] = deployment
            deployment.start(print)
        return started[mode]

    yield of
    for deployment in started.values():
        deployment.stop()


async def crash_wave(url: str, model: str) -> list[Completion]:
    prompts = build_prompts(CRASH_WAVE, CRASH_PROMPT_LEN, seed=12)
    timeout = aiohttp.ClientTimeout(total=WAVE_BOUND_S + 30.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        calls = [
            complete(session, url, model, i, p, CRASH_MAX_TOKENS) for i, p in enumerate(prompts)
        ]
        return list(await asyncio.gather(*calls))


def requests_on(deployment: Deployment, slot: EngineSlot) -> float:
    samples = deployment.metrics(slot)
    return total(samples, "vllm:num_requests_running") + total(samples, "vllm:num_requests_waiting")


def seconds_until_no_block_held(deployment: Deployment, slot: EngineSlot, bound: float) -> float:
    """Seconds until ``slot`` holds no block (``inf`` if not within ``bound``)."""
    started = time.monotonic()
    while time.monotonic() - started < bound:
        if held_blocks(deployment.metrics(slot)) == 0:
            return time.monotonic() - started
        time.sleep(0.2)
    return float("inf")


def listed_stale(deployment: Deployment, slot: EngineSlot) -> bool:
    """Whether the router lists ``slot`` as stale within its bound."""
    deadline = time.monotonic() + DEFAULT_STALE_AFTER_S + SLACK_S
    while time.monotonic() < deadline:
        if slot.url in deployment.router_stats().get("stale", ()):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("victim", ["decode", "prefill"])
@pytest.mark.parametrize("mode", ["read", "write"])
def test_an_engine_killed_mid_wave_hangs_nothing_and_leaks_no_block(
    reference: Callable[[str], Reference],
    deployments: Callable[[str], Deployment],
    mode: str,
    victim: str,
) -> None:
    model_dir, prompts, expected = reference(victim)
    model = str(model_dir)
    deployment = deployments(mode)
    url = f"{deployment.router_url}/v1/completions"
    killed, survivor = sorted(deployment.slots, key=lambda s: s.role != victim)
    decode = next(s for s in deployment.slots if s.role == "decode")
    wave: list[Completion] = []
    sender = threading.Thread(target=lambda: wave.extend(asyncio.run(crash_wave(url, model))))
    sender.start()
    deadline = time.monotonic() + 10.0
    while requests_on(deployment, decode) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    deployment.kill(killed)
    killed_at = time.monotonic()
    reclaim_s = seconds_until_no_block_held(deployment, survivor, RECLAIM_S)
    sender.join(WAVE_BOUND_S + 60.0)
    wave_s = max((c.ended_at for c in wave), default=killed_at) - killed_at
    stale = listed_stale(deployment, killed)
    stale_s = time.monotonic() - killed_at
    refused = asyncio.run(run_batch(url, model, [(0, prompts[0])], MAX_TOKENS))[0]
    deployment.restart(killed)
    before_recovery = decode_metrics(deployment)
    recovery = asyncio.run(run_batch(url, model, list(enumerate(prompts)), MAX_TOKENS))
    recovery_sources = decode_sources(deployment, before_recovery)
    held = {
        slot.name: seconds_until_no_block_held(deployment, slot, RECLAIM_S)
        for slot in deployment.slots
    }
    answered = sum(c.error is None for c in wave)
    errors = sorted({str(c.error)[:60] for c in wave})
    print(
        f"\n{mode}, {victim} killed: wave {answered}/{CRASH_WAVE} answered, all ended "
        f"{wave_s:.1f} s after the kill; {survivor.name} free {reclaim_s:.1f} s after it; "
        f"stale at the router {stale_s:.1f} s after the kill; errors {errors}"
    )
    assert not sender.is_alive(), "a client of the crash wave is still waiting"
    assert len(wave) == CRASH_WAVE
    assert max(c.latency_s for c in wave) < WAVE_BOUND_S, [c.latency_s for c in wave]
    assert wave_s <= DEAD_PEER_BOUND_S, [round(c.ended_at - killed_at, 1) for c in wave]
    assert reclaim_s <= DEAD_PEER_BOUND_S
    # The router stops sending requests to the dead engine: a client is refused at once.
    assert stale
    assert refused.error is not None
    assert "HTTP 503" in refused.error, refused.error
    assert refused.latency_s < 5.0
    assert [c.error for c in recovery if c.error] == []
    assert [c.index for c in recovery if tuple(c.tokens) != expected[c.index]] == []
    assert_prompt_kv_over_the_wire(recovery_sources, sum(map(len, prompts)), detail="recovery")
    assert all(seconds <= RECLAIM_S for seconds in held.values()), held
