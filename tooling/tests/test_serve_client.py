"""The streaming client times tokens by the network reads that bring them: events that
arrive in one read were not apart by the time it takes to parse them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import aiohttp
from aiohttp import web

from moriio_tools.serve.client import Completion, complete

PAUSE_S = 0.2


def _event(ids: Sequence[int]) -> bytes:
    choice = {"index": 0, "text": "x", "token_ids": list(ids), "finish_reason": None}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


async def _serve(writes: Sequence[bytes], tokens: int) -> Completion:
    """One completion from a server that sends ``writes``, each flushed, ``PAUSE_S`` apart."""

    async def handler(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse()
        out.content_type = "text/event-stream"
        await out.prepare(request)
        for n, data in enumerate(writes):
            if n:
                await asyncio.sleep(PAUSE_S)
            await out.write(data)
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v1/completions"
            return await complete(session, url, "m", 0, [1, 2, 3], tokens)
    finally:
        await runner.cleanup()


def test_tokens_that_arrive_together_share_the_gap_since_the_read_before() -> None:
    # 1 token, then 2 events in one write (a burst), then 1 token.
    got = asyncio.run(_serve([_event([7]), _event([8]) + _event([9]), _event([10])], 4))
    assert got.error is None
    assert got.tokens == [7, 8, 9, 10]
    assert got.ttft_s is not None
    assert len(got.itl_s) == 3  # one sample per token after the first read
    assert got.itl_s[0] == got.itl_s[1]  # the burst: one gap, shared, not a parse time
    assert len(got.token_walls) == 3  # one per read that brought tokens


def test_an_event_cut_between_reads_counts_once_it_is_whole() -> None:
    whole = _event([5])
    got = asyncio.run(_serve([_event([4]), whole[:10], whole[10:]], 2))
    assert got.error is None
    assert got.tokens == [4, 5]
    assert len(got.itl_s) == 1


def test_an_error_event_ends_the_completion_with_its_message() -> None:
    error = b'data: {"error": {"message": "decode failed"}}\n\n'
    got = asyncio.run(_serve([_event([4]), error], 2))
    assert got.error is not None
    assert "decode failed" in got.error
