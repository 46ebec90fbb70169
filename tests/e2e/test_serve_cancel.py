"""Clients that give up mid-request, in a real 1P1D ``vllm serve`` deployment behind
``moriio router``.

Amid normal traffic, other clients close their HTTP connection at random points of a request's
life: while the prefill runs, between the prefill's answer and the decode's load, while the
decode waits for its KV, and after the first tokens. Then, after an idle gap, a second wave of
normal requests. Every normal output must equal a single plain engine's, and both engines must
end with no block held (leases are shortened, so that a hand-off nobody releases would be
reclaimed, and so counted, within the wait).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from moriio_tools.harness import (
    Completion,
    Deployment,
    Prompt,
    Sample,
    ServeDemoConfig,
    build_prompts,
    complete,
    completion_body,
    held_blocks,
    run_batch,
    total,
)
from support.llama_reference import LlamaReference
from support.prompt_kv import assert_prompt_kv_over_the_wire, decode_metrics, decode_sources

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

NORMAL = 8  # in each of the two waves
MAX_TOKENS = 16
CANCELLED = 18
# Abandoned requests are long, so that a random moment often falls inside a transfer.
CANCELLED_PROMPT_LEN = 900
CANCELLED_MAX_TOKENS = 64
# A hand-off nobody releases is reclaimed defer_timeout + clock_skew_allowance after its prefill.
LEASES = {"transfer_timeout": 5.0, "defer_timeout": 10.0, "clock_skew_allowance": 1.0}
SETTLE_S = 60.0


@pytest.fixture(scope="module")
def reference(llama_reference: LlamaReference) -> tuple[Path, list[Prompt], list[Any]]:
    model_dir, prompts, expected = llama_reference.prompt_set("cancel")
    assert len(prompts) == 2 * NORMAL
    assert ServeDemoConfig().max_tokens == MAX_TOKENS
    return model_dir, prompts, expected


async def abandoned(url: str, model: str, prompt: Sequence[int], when: str, delay: float) -> str:
    """Start a streamed completion and close the connection: after ``delay`` s
    (``when="timed"``) or once the first token arrived (``when="first_token"``).
    Returns how far it got."""
    body = completion_body(model, prompt, CANCELLED_MAX_TOKENS)

    async def read_until_cancelled(session: aiohttp.ClientSession) -> str:
        async with session.post(url, json=body) as resp:
            async for raw in resp.content:
                if when == "first_token" and b"token_ids" in raw:
                    return "cancelled after the first token"
            return "finished before it was cancelled"

    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            return await asyncio.wait_for(
                read_until_cancelled(session), delay if when == "timed" else 60.0
            )
        except TimeoutError:
            return "cancelled by timer" if when == "timed" else "no first token in 60 s"


async def mixed_wave(
    url: str, model: str, prompts: Sequence[Prompt], rng: random.Random
) -> tuple[list[Completion], list[str]]:
    """The first NORMAL prompts and CANCELLED abandoned long requests, all in flight together."""
    normal = [complete_one(url, model, i, prompts[i]) for i in range(NORMAL)]
    cancels = []
    for n, prompt in enumerate(build_prompts(CANCELLED, CANCELLED_PROMPT_LEN, seed=8)):
        if n % 3 == 2:
            cancels.append(abandoned(url, model, prompt, "first_token", 0.0))
        else:  # early (prefill running) or later (hand-off, load, decoding)
            delay = rng.uniform(0.0, 0.3) if n % 3 == 0 else rng.uniform(0.3, 1.5)
            cancels.append(abandoned(url, model, prompt, "timed", delay))
    answered, outcomes = await asyncio.gather(asyncio.gather(*normal), asyncio.gather(*cancels))
    return list(answered), list(outcomes)


async def complete_one(url: str, model: str, index: int, prompt: Prompt) -> Completion:
    async with aiohttp.ClientSession() as session:
        return await complete(session, url, model, index, prompt, MAX_TOKENS)


def finished_normally(samples: Sequence[Sample]) -> int:
    """Requests the engine ran to their end (vLLM counts no client abort here)."""
    return int(
        sum(
            s.value
            for s in samples
            if s.name == "vllm:request_success_total"
            and s.labels.get("finished_reason") in ("stop", "length")
        )
    )


def settle(deployment: Deployment) -> dict[str, int]:
    """Blocks each engine holds, once none holds any (or after SETTLE_S)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        held = {slot.name: held_blocks(deployment.metrics(slot)) for slot in deployment.slots}
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.5)


@pytest.mark.parametrize("mode", ["read", "write"])
def test_cancelled_requests_leave_no_block_held_and_no_output_changed(
    reference: tuple[Path, list[Prompt], list[Any]], tmp_path: Path, mode: str
) -> None:
    model_dir, prompts, expected = reference
    model = str(model_dir)
    deployment = Deployment(model_dir, mode, tmp_path, connector_extra=dict(LEASES))
    with deployment:
        deployment.start(print)
        url = f"{deployment.router_url}/v1/completions"
        first, outcomes = asyncio.run(mixed_wave(url, model, prompts, random.Random(mode)))
        time.sleep(2.0)  # an idle gap: nothing steps either engine
        before_second = decode_metrics(deployment)
        second = asyncio.run(
            run_batch(url, model, [(i, prompts[i]) for i in range(NORMAL, 2 * NORMAL)], MAX_TOKENS)
        )
        second_sources = decode_sources(deployment, before_second)
        held = settle(deployment)
        samples = {slot.name: deployment.metrics(slot) for slot in deployment.slots}
    finished = {name: finished_normally(engine) for name, engine in samples.items()}
    expired = int(total(samples["prefill0"], "vllm:moriio_expired_leases_total"))
    print(f"\n{mode}: {sorted(outcomes)}; finished {finished}; expired {expired}; held {held}")
    normal = [*first, *second]
    assert [c.error for c in normal if c.error] == []
    assert [c.index for c in normal if tuple(c.tokens) != expected[c.index]] == []
    assert sum(o.startswith("cancelled") for o in outcomes) >= CANCELLED // 2, outcomes
    # Some cancellations cut a request short on the decode engine (vLLM aborted it there).
    assert finished["decode0"] < 2 * NORMAL + CANCELLED, finished
    assert held == {"prefill0": 0, "decode0": 0}, held
    # The wave after the cancels (nothing else in flight): its prompt KV came over the wire.
    second_tokens = sum(len(prompts[i]) for i in range(NORMAL, 2 * NORMAL))
    assert_prompt_kv_over_the_wire(second_sources, second_tokens)
    # The router keeps each leg to its end, so an aborted decode releases the prefill's blocks
    # at once: none waits for its lease.
    assert expired == 0
