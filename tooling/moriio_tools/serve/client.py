"""An OpenAI ``/v1/completions`` streaming client that times what a user sees.

Prompts are token-id lists (the completions API takes them as they are), decoding is
greedy with ``ignore_eos``, and ``return_token_ids`` makes every streamed chunk carry the
ids it adds, so outputs compare exactly. TTFT is the time from sending the request to the
first network read that brings a token. Inter-token latencies are measured per network read,
not per server-sent event: a read that brings ``n`` tokens ``gap`` seconds after the previous
one gives ``n`` samples of ``gap / n`` (events that arrived together were not apart by the
time it takes to parse them); tokens in the first read give none.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

REQUEST_TIMEOUT_S = 300.0


@dataclass(slots=True)
class Completion:
    index: int
    tokens: list[int] = field(default_factory=list)
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    latency_s: float = 0.0
    error: str | None = None
    ended_at: float = 0.0  # time.monotonic() when the answer (or the error) ended
    request_id: str = ""  # sent as X-Request-Id when set
    sent_wall: float = 0.0  # time.time() when the request was sent
    token_walls: list[float] = field(default_factory=list)  # time.time() of each read with tokens


def completion_body(model: str, prompt: Sequence[int], max_tokens: int) -> dict[str, object]:
    """A streamed, greedy completion of exactly ``max_tokens`` token ids."""
    return {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }


async def complete(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    index: int,
    prompt: Sequence[int],
    max_tokens: int,
    request_id: str = "",
) -> Completion:
    """One streamed completion; errors are recorded, never raised. ``request_id``: sent as
    ``X-Request-Id`` (a router's timeline names it)."""
    body = completion_body(model, prompt, max_tokens)
    out = Completion(index, request_id=request_id)
    headers = {"X-Request-Id": request_id} if request_id else None
    out.sent_wall = time.time()
    started = time.perf_counter()
    last = started
    pending = b""
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return out
            async for raw in resp.content.iter_any():
                now, wall = time.perf_counter(), time.time()
                lines = (pending + raw).split(b"\n")
                pending = lines.pop()  # an event cut by the read: finished by the next one
                tokens = _tokens(lines, out)
                if out.error is not None:
                    return out
                if not tokens:
                    continue
                out.token_walls.append(wall)
                if out.ttft_s is None:
                    out.ttft_s = now - started
                else:
                    out.itl_s.extend([(now - last) / len(tokens)] * len(tokens))
                last = now
                out.tokens.extend(tokens)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, KeyError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.latency_s = time.perf_counter() - started
        out.ended_at = time.monotonic()
    if out.error is None and len(out.tokens) != max_tokens:
        out.error = f"expected {max_tokens} tokens, got {len(out.tokens)}"
    return out


def _tokens(lines: list[bytes], out: Completion) -> list[int]:
    """The token ids the events in ``lines`` bring; sets ``out.error`` on an error event."""
    tokens: list[int] = []
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            out.error = str(chunk["error"])[:300]
            return tokens
        tokens.extend(int(t) for t in chunk["choices"][0].get("token_ids") or [])
    return tokens


async def run_batch(
    url: str,
    model: str,
    prompts: Sequence[tuple[int, Sequence[int]]],
    max_tokens: int,
    *,
    gap_s: float = 0.0,
) -> list[Completion]:
    """Send ``(index, prompt)`` pairs: all at once, or one at a time ``gap_s`` apart."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if gap_s <= 0:
            calls = [complete(session, url, model, i, p, max_tokens) for i, p in prompts]
            return list(await asyncio.gather(*calls))
        results = []
        for n, (i, p) in enumerate(prompts):
            if n:
                await asyncio.sleep(gap_s)
            results.append(await complete(session, url, model, i, p, max_tokens))
        return results
