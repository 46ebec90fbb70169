"""The soak's traffic: bursts, trickles after idle gaps, and clients that give up mid-stream."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from moriio_tools.prompts import Prompt
from moriio_tools.serve.client import Completion, complete, completion_body, run_batch

FIRST_TOKEN_WAIT_S = 60.0  # an abandoning client gives up waiting for its first token


@dataclass(slots=True)
class Outcome:
    """What one step of traffic got: answers to pool prompts (``Completion.index`` is the
    prompt's index in the pool) and how many abandoning clients cut their request short."""

    completions: list[Completion] = field(default_factory=list)
    cancelled: int = 0


def pick(rng: random.Random, pool: int, count: int) -> list[int]:
    """``count`` pool indices, each prompt at most once while the pool lasts."""
    order: list[int] = []
    while len(order) < count:
        order += rng.sample(range(pool), min(pool, count - len(order)))
    return order


def burst(
    url: str, model: str, pool: Sequence[Prompt], picks: Sequence[int], max_tokens: int
) -> Outcome:
    """Every picked prompt in flight at once."""
    items = [(i, pool[i]) for i in picks]
    return Outcome(asyncio.run(run_batch(url, model, items, max_tokens)))


def trickle(
    url: str,
    model: str,
    pool: Sequence[Prompt],
    picks: Sequence[int],
    max_tokens: int,
    gap_s: float,
) -> Outcome:
    """An idle gap of ``gap_s``, then the picked prompts one at a time ``gap_s`` apart: both
    engines fall idle before each request."""
    items = [(i, pool[i]) for i in picks]

    async def run() -> list[Completion]:
        await asyncio.sleep(gap_s)
        return await run_batch(url, model, items, max_tokens, gap_s=gap_s)

    return Outcome(asyncio.run(run()))


async def abandon(
    url: str, model: str, prompt: Sequence[int], max_tokens: int, delay_s: float | None
) -> bool:
    """Start a streamed completion and close the connection after ``delay_s`` (None: once
    the first token arrived). Whether it was cut short (not finished first)."""
    body = completion_body(model, prompt, max_tokens)

    async def read_until_cancelled(session: aiohttp.ClientSession) -> bool:
        async with session.post(url, json=body) as resp:
            async for raw in resp.content:
                if delay_s is None and b"token_ids" in raw:
                    return True
            return False

    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            wait = FIRST_TOKEN_WAIT_S if delay_s is None else delay_s
            return await asyncio.wait_for(read_until_cancelled(session), wait)
        except TimeoutError:
            return delay_s is not None
        except aiohttp.ClientError:
            return False


def cancel_wave(
    url: str,
    model: str,
    pool: Sequence[Prompt],
    picks: Sequence[int],
    abandoned: Sequence[Prompt],
    max_tokens: int,
    abandoned_max_tokens: int,
    rng: random.Random,
) -> Outcome:
    """The picked pool prompts amid clients that give up on the ``abandoned`` prompts at
    random points of a request's life: while the prefill runs (0-0.3 s), around the hand-off
    and the decode's load (0.3-1.5 s) or after the first token."""
    delays = [
        None if n % 3 == 2 else rng.uniform(0.0, 0.3) if n % 3 == 0 else rng.uniform(0.3, 1.5)
        for n in range(len(abandoned))
    ]

    async def run() -> tuple[list[Completion], list[bool]]:
        timeout = aiohttp.ClientTimeout(total=300.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            normal = [complete(session, url, model, i, pool[i], max_tokens) for i in picks]
            cancels = [
                abandon(url, model, p, abandoned_max_tokens, d)
                for p, d in zip(abandoned, delays, strict=True)
            ]
            answered, cut = await asyncio.gather(asyncio.gather(*normal), asyncio.gather(*cancels))
            return list(answered), list(cut)

    answered, cut = asyncio.run(run())
    return Outcome(answered, sum(cut))
