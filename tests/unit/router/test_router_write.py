"""``moriio router`` against stand-in engines over real HTTP on loopback: WRITE legs, and the
hand-offs the router gives back when a decode leg fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from moriio.adapters.zmq.channel import ZmqControlChannel
from moriio.cli.router import open_release_channel
from moriio.domain.params.transfer_params import with_token
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Message, Release
from moriio.domain.values.capability import new_token
from moriio.router.app import Router
from moriio.router.handoffs import HandoffReturns
from moriio.router.registry import Instance, Registry, parse_announcement
from moriio.timeline import Timeline, read_events
from moriio_tools.harness import free_ports

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
    prefill_answer: Handler,
    decode_answer: Handler | None,
    mode: str = "WRITE",
    timeline: Timeline | None = None,
    engine_connections: int = 0,
) -> AsyncIterator[tuple[str, Engine, Engine]]:
    """Both stand-ins registered with a router (``decode_answer`` None: nothing listens at
    the decode's port)."""
    p_port, d_port, r_port = free_ports(3)
    prefill, decode = Engine(p_port, prefill_answer), Engine(d_port, decode_answer or _ok)
    registry = Registry()
    for engine, kind, notify in ((prefill, "P", 7005), (decode, "D", 7105)):
        instance = parse_announcement(
            {
                "type": kind,
                "http_address": f"127.0.0.1:{engine.port}",
                "zmq_address": f"host:127.0.0.1,handshake:{notify + 300},notify:{notify}",
                "dp_size": 2,
                "tp_size": 1,
                "transfer_mode": mode,
            }
        )
        assert instance is not None
        registry.add(instance)
    apps = []
    for engine in (prefill, decode):
        app = web.Application()
        app.router.add_post("/v1/completions", engine.handle)
        apps.append(app)
    decode_app = apps[1] if decode_answer is not None else web.Application()
    async with (
        _serving(apps[0], p_port),
        _serving(decode_app, d_port) if decode_answer is not None else _nothing(),
        _serving(
            Router(
                registry, open_release_channel, timeline, engine_connections=engine_connections
            ).app(),
            r_port,
        ),
    ):
        yield f"http://127.0.0.1:{r_port}/v1/completions", prefill, decode


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


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


@dataclass
class Concurrency:
    """A stand-in engine's answer that counts the requests it holds at once."""

    hold_until: int = 0  # answer none before this many are held at once (0: hold each briefly)
    held: int = 0
    most: int = 0
    reached: asyncio.Event = field(default_factory=asyncio.Event)

    async def answer(self, _request: web.Request) -> web.StreamResponse:
        self.held += 1
        self.most = max(self.most, self.held)
        if self.held >= self.hold_until:
            self.reached.set()
        try:
            await asyncio.wait_for(self.reached.wait(), 10.0) if self.hold_until else None
            await asyncio.sleep(0.05)
        except TimeoutError:
            return web.Response(status=504, text=f"only {self.most} requests ever held at once")
        finally:
            self.held -= 1
        return web.json_response({"choices": [{"text": "ok"}]})


@pytest.mark.parametrize("mode", ["READ", "WRITE"])
def test_more_decodes_than_a_default_http_pool_holds_are_all_in_flight_at_once(mode: str) -> None:
    # aiohttp's default pool holds 100 connections: the 101st decode would wait in the router.
    decode = Concurrency(hold_until=110)

    async def run() -> list[tuple[int, str]]:
        prefill = _read_prefill if mode == "READ" else _ok
        async with (
            _world(prefill, decode.answer, mode) as (url, _p, _d),
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
        ):
            return await asyncio.gather(*(_post(s, url) for _ in range(110)))

    results = asyncio.run(run())
    assert [r for r in results if r[0] != 200] == []
    assert decode.most == 110


def test_engine_connections_bounds_the_connections_to_each_engine() -> None:
    prefill, decode = Concurrency(), Concurrency()

    async def run() -> list[tuple[int, str]]:
        async with (
            _world(prefill.answer, decode.answer, "WRITE", engine_connections=3) as (url, _p, _d),
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
        ):
            return await asyncio.gather(*(_post(s, url) for _ in range(12)))

    assert [status for status, _ in asyncio.run(run())] == [200] * 12
    assert (prefill.most, decode.most) == (3, 3)


def test_a_negative_engine_connections_is_refused() -> None:
    with pytest.raises(ValueError, match="engine_connections"):
        Router(Registry(), None, engine_connections=-1)


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


TOKEN = new_token()


async def _refuses(_request: web.Request) -> web.StreamResponse:
    return web.Response(status=503, text="decode overloaded")


async def _read_prefill(request: web.Request) -> web.StreamResponse:
    """A READ prefill: the hand-off's params, with its capability in the engine id."""
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": with_token("127.0.0.1:7305", TOKEN),
        "remote_host": "127.0.0.1",
        "remote_handshake_port": 7305,
        "remote_notify_port": 7005,
        "remote_block_ids": [[1, 2]],
        "remote_dp_rank": 1,
        "remote_tp_size": 1,
    }
    return web.json_response({"choices": [{"text": "x"}], "kv_transfer_params": params})


def _releases_after(
    prefill_answer: Handler, decode_answer: Handler | None, mode: str, port: int
) -> tuple[int, dict[str, Any], list[Message]]:
    """The status the client got, the prefill's view of the transfer, and the releases that
    reached the prefill's notify ``port``."""

    async def run() -> tuple[int, dict[str, Any], list[Message]]:
        with ZmqControlChannel(WIRE_CODEC, "127.0.0.1", port) as notify:
            async with (
                _world(prefill_answer, decode_answer, mode) as (url, prefill, _decode),
                aiohttp.ClientSession() as s,
            ):
                status, _ = await _post(s, url)
                received: list[Message] = []
                for _ in range(50):
                    received += [i.message for i in notify.drain(0.0)]
                    if received:
                        break
                    await asyncio.sleep(0.05)
                return status, prefill.seen[0][1], received

    return asyncio.run(run())


@pytest.mark.parametrize("mode", ["READ", "WRITE"])
def test_the_router_records_each_legs_events_under_the_client_id(mode: str, tmp_path: Path) -> None:
    async def run() -> int:
        timeline = Timeline(str(tmp_path), "router")
        prefill = _read_prefill if mode == "READ" else _ok
        async with (
            _world(prefill, _ok, mode, timeline) as (url, _p, _d),
            aiohttp.ClientSession() as s,
            s.post(url, json={"prompt": "hi"}, headers={"X-Request-Id": "c-7"}) as resp,
        ):
            await resp.read()
            return resp.status

    assert asyncio.run(run()) == 200
    events = sorted(read_events(tmp_path), key=lambda e: e["t"])
    names = [e["ev"] for e in events]
    legs = ["router.prefill_answered"] if mode == "READ" else []  # WRITE: legs leave together
    legs.append("router.decode_sent")
    assert names == ["router.received", *legs, "router.first_chunk", "router.done"]
    assert events[0]["client"] == "c-7"
    assert len({e["id"] for e in events}) == 1  # one transfer id joins them


def test_a_write_decode_that_fails_gets_its_prefill_hand_off_cancelled() -> None:
    status, sent, received = _releases_after(_ok, _refuses, "WRITE", 7005)
    assert status == 503
    assert received == [Release(sent["transfer_id"], 1, 0, "")]  # no capability: cancel only


def test_a_read_decode_that_refuses_the_connection_gets_its_hand_off_given_back() -> None:
    # The prefill answered on DP rank 1: its rank-1 notify port gets the release.
    status, sent, received = _releases_after(_read_prefill, None, "READ", 7006)
    assert status == 502
    assert received == [Release(sent["transfer_id"], 1, 0, TOKEN)]


def test_a_read_decode_that_answers_keeps_its_hand_off() -> None:
    status, _sent, received = _releases_after(_read_prefill, _refuses, "READ", 7006)
    assert status == 503
    assert received == []  # it may have read the blocks: only the decode releases them


class _Recorder(HandoffReturns):
    def __init__(self) -> None:
        super().__init__(None)
        self.given: list[int] = []

    def give_back(self, prefill: Instance, decode_params: Mapping[str, Any], dp_rank: int) -> None:
        self.given.append(dp_rank)


def _instance(kind: str, http_port: int) -> Instance:
    instance = parse_announcement(
        {
            "type": kind,
            "http_address": f"127.0.0.1:{http_port}",
            "zmq_address": "host:127.0.0.1,handshake:7305,notify:7005",
            "dp_size": 1,
            "tp_size": 1,
            "transfer_mode": "READ",
        }
    )
    assert instance is not None
    return instance


def test_a_read_hand_off_is_given_back_only_once_its_broken_decode_is_gone() -> None:
    (gone_port,) = free_ports(1)  # nothing listens there: the decode's server is gone

    async def run() -> list[int]:
        router = Router(Registry(), None)
        router.handoffs = recorder = _Recorder()
        prefill = _instance("P", 1)
        async with _serving(web.Application(), live_port := free_ports(1)[0]):
            await router.handoffs.give_back_if_gone(_instance("D", live_port), prefill, {}, 3)
        await router.handoffs.give_back_if_gone(_instance("D", gone_port), prefill, {}, 4)
        return recorder.given

    assert asyncio.run(run()) == [4]  # not for the decode still serving
