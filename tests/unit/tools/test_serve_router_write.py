"""``moriio router`` in WRITE mode against stand-in engines over real HTTP on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from moriio.tools.serve.processes import free_ports
from moriio.tools.serve.registry import Registry, parse_announcement
from moriio.tools.serve.router import Router

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Engine:
    """A stand-in ``vllm serve``: records what each request carried."""

    port: int
    answer: Handler
    seen: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    cancelled: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((dict(request.headers), body["kv_transfer_params"]))
        try:
            return await self.answer(request)
        except asyncio.CancelledError:  # aiohttp cancels a handler whose client went away
            self.cancelled += 1
            raise


async def _ok(_request: web.Request) -> web.StreamResponse:
    return web.json_response({"choices": [{"text": "ok"}]})


async def _unavailable(_request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(0.2)
    return web.Response(status=503, text="prefill engine overloaded")


async def _waits_for_kv(_request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(30.0)  # KV that never comes
    return web.json_response({"choices": [{"text": "late"}]})


@asynccontextmanager
async def _serving(app: web.Application, port: int) -> AsyncIterator[None]:
    runner = web.AppRunner(app, handler_cancellation=True)  # as vLLM aborts on disconnect
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield
    finally:
        await runner.cleanup()


@asynccontextmanager
async def _world(
    prefill_answer: Handler, decode_answer: Handler
) -> AsyncIterator[tuple[str, Engine, Engine]]:
    p_port, d_port, r_port = free_ports(3)
    prefill, decode = Engine(p_port, prefill_answer), Engine(d_port, decode_answer)
    registry = Registry()
    for engine, kind, notify in ((prefill, "P", 7005), (decode, "D", 7105)):
        instance = parse_announcement(
            {
                "type": kind,
                "http_address": f"127.0.0.1:{engine.port}",
                "zmq_address": f"host:127.0.0.1,handshake:{notify + 300},notify:{notify}",
                "dp_size": 2,
                "tp_size": 1,
                "transfer_mode": "WRITE",
            }
        )
        assert instance is not None
        registry.add(instance)
    apps = []
    for engine in (prefill, decode):
        app = web.Application()
        app.router.add_post("/v1/completions", engine.handle)
        apps.append(app)
    async with (
        _serving(apps[0], p_port),
        _serving(apps[1], d_port),
        _serving(Router(registry).app(), r_port),
    ):
        yield f"http://127.0.0.1:{r_port}/v1/completions", prefill, decode


async def _post(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.post(url, json={"prompt": "hi", "max_tokens": 4}) as resp:
        return resp.status, await resp.text()


def test_each_write_leg_names_its_own_dp_rank_and_the_other_engines() -> None:
    async def run() -> list[tuple[int, str]]:
        async with _world(_ok, _ok) as (url, prefill, decode), aiohttp.ClientSession() as s:
            results = [await _post(s, url), await _post(s, url)]
            for turn in range(2):
                p_headers, p_params = prefill.seen[turn]
                d_headers, d_params = decode.seen[turn]
                assert p_headers["X-data-parallel-rank"] == str(turn)
                assert d_headers["X-data-parallel-rank"] == str(turn)
                assert p_params["remote_dp_rank"] == turn  # the decode rank it pushes to
                assert d_params["remote_dp_rank"] == turn  # the prefill rank it notifies
                assert p_params["remote_dp_size"] == d_params["remote_dp_size"] == 2
            return results

    assert [status for status, _ in asyncio.run(run())] == [200, 200]


def test_a_failed_write_prefill_cuts_its_decode_short_with_the_prefill_status() -> None:
    async def run() -> tuple[int, str, int, float]:
        async with (
            _world(_unavailable, _waits_for_kv) as (url, _prefill, decode),
            aiohttp.ClientSession() as s,
        ):
            started = asyncio.get_running_loop().time()
            status, text = await _post(s, url)
            elapsed = asyncio.get_running_loop().time() - started
            for _ in range(100):  # the decode engine sees the disconnect a moment later
                if decode.cancelled:
                    break
                await asyncio.sleep(0.02)
            return status, text, decode.cancelled, elapsed

    status, text, cancelled, elapsed = asyncio.run(run())
    assert status == 503
    assert "prefill engine overloaded" in text
    assert cancelled == 1
    assert elapsed < 10.0
