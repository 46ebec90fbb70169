"""A proxy for vLLM's own connectors between two stand-in engines, over real HTTP."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from moriio_tools.harness import PeerProxy, free_ports

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def post_through(
    make_proxy: Callable[[str, str], PeerProxy],
    prefill: Handler,
    decode: Handler,
    body: dict[str, Any],
) -> tuple[int, str]:
    """Serve ``prefill`` and ``decode`` as engines and ``make_proxy(prefill_url,
    decode_url)`` in front; POST ``body`` to the proxy; its status and text."""
    p_port, d_port, proxy_port = free_ports(3)
    apps: list[tuple[web.Application, int]] = []
    for handler, port in ((prefill, p_port), (decode, d_port)):
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        apps.append((app, port))
    proxy = make_proxy(f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}")
    apps.append((proxy.app(), proxy_port))
    runners = []
    try:
        for app, port in apps:
            runner = web.AppRunner(app)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, "127.0.0.1", port).start()
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{proxy_port}/v1/completions", json=body) as resp,
        ):
            return resp.status, await resp.text()
    finally:
        for runner in runners:
            await runner.cleanup()
