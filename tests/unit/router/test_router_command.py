"""``moriio router`` as a command: its missing extra, its start-up line, its log levels."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from moriio.cli import router as router_command
from moriio.cli.main import build_parser, main
from moriio.router.app import Router
from moriio.router.registry import Registry, parse_announcement
from moriio_tools.harness import free_ports


def test_without_aiohttp_the_router_names_its_extra_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        router_command, "find_spec", lambda name: None if name == "aiohttp" else object()
    )
    assert main(["router"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [router_command.MISSING_AIOHTTP]
    assert "pip install 'moriio[router]'" in captured.err


def test_the_start_up_line_names_both_addresses() -> None:
    args = build_parser().parse_args(["router", "--host", "::1", "--port", "9000"])
    assert router_command.listening_line(args) == (
        "listening on http://[::1]:9000 (OpenAI API); engines register on tcp://[::1]:36367"
    )


def test_the_router_logs_levels_and_where_it_listens_once_it_does() -> None:
    port, ping_port = free_ports(2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-m", "moriio.cli.main", "router"]
    argv += ["--port", str(port), "--ping-port", str(ping_port)]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert " INFO moriio.router: listening on " in line
        assert f"http://127.0.0.1:{port} (OpenAI API)" in line
        assert f"tcp://127.0.0.1:{ping_port}" in line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_read_request_logs_its_prefill_answer_at_debug_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="moriio.router"):
        asyncio.run(_one_read_request())
    answered = [r for r in caplog.records if r.getMessage().startswith("prefill answered")]
    assert [r.levelno for r in answered] == [logging.DEBUG]
    per_request = [r for r in caplog.records if not r.msg.startswith("registered instance")]
    assert [r.levelno for r in per_request] == [logging.DEBUG]


async def _one_read_request() -> None:
    """One READ request through a router to stand-in engines."""
    p_port, d_port, r_port = free_ports(3)
    registry = Registry()
    for kind, port in (("P", p_port), ("D", d_port)):
        instance = parse_announcement(
            {
                "type": kind,
                "http_address": f"127.0.0.1:{port}",
                "zmq_address": f"host:127.0.0.1,handshake:{port + 1},notify:{port + 2}",
                "dp_size": 1,
                "tp_size": 1,
                "transfer_mode": "READ",
            }
        )
        assert instance is not None
        registry.add(instance)

    async def prefill(_request: web.Request) -> web.Response:
        return web.json_response({"kv_transfer_params": {"remote_block_ids": [[1]]}})

    async def decode(_request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"text": "ok"}]})

    runners = []
    for handler, port in ((prefill, p_port), (decode, d_port)):
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runners.append((app, port))
    runners.append((Router(registry, None).app(), r_port))
    started: list[web.AppRunner] = []
    try:
        for app, port in runners:
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            started.append(runner)
        body: dict[str, Any] = {"model": "m", "prompt": "hi", "max_tokens": 4}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{r_port}/v1/completions", json=body) as resp,
        ):
            assert resp.status == 200
            await resp.read()
    finally:
        for runner in reversed(started):
            await runner.cleanup()
