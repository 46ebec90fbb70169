"""The prefill's first token sent ahead: which requests qualify, how the decode's stream
loses its first token, and ``moriio router --first-token-ahead`` over real HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from moriio.router.app import Router
from moriio.router.first_token import (
    DecodeStream,
    FirstToken,
    FirstTokenMismatchError,
    first_token,
)
from moriio.router.registry import Registry, parse_announcement
from moriio_tools.harness import NixlProxy, free_ports

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
GREEDY = {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.0, "stream": True}
HEAD = {"id": "cmpl-x", "created": 7, "model": "m"}


def _answer(text: str = "Hello", finish: str = "length", ids: list[int] | None = None) -> Any:
    """The prefill's non-streamed completions answer, as vLLM returns it."""
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"], choice["prompt_token_ids"] = ids, [1, 2, 3]
    return {**HEAD, "object": "text_completion", "choices": [choice]}


def _chat_answer(message: dict[str, Any]) -> Any:
    choice = {"index": 0, "message": message, "finish_reason": "length"}
    return {**HEAD, "object": "chat.completion", "choices": [choice]}


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _completion_stream(pieces: list[tuple[str, int]], finish_last: bool = True) -> bytes:
    """The decode's stream as vLLM sends it with ``return_token_ids``."""
    out = b""
    for n, (text, token) in enumerate(pieces):
        last = finish_last and n == len(pieces) - 1
        choice = {"index": 0, "text": text, "token_ids": [token]}
        choice["finish_reason"] = "length" if last else None
        if n == 0:
            choice["prompt_token_ids"] = [1, 2, 3]
        out += _sse({**HEAD, "object": "text_completion", "choices": [choice]})
    return out + b"data: [DONE]\n\n"


def _events(raw: bytes) -> list[Any]:
    return [
        json.loads(e[6:]) if e.startswith(b"data: {") else e.decode()
        for e in raw.split(b"\n\n")
        if e
    ]


def _texts(raw: bytes) -> list[str]:
    return [e["choices"][0]["text"] for e in _events(raw) if isinstance(e, dict) and "choices" in e]


# -- which requests qualify ----------------------------------------------------------------


def test_a_greedy_streamed_completion_gets_the_prefill_token_as_vllm_streams_it() -> None:
    first = first_token(COMPLETIONS, {**GREEDY, "return_token_ids": True}, _answer(ids=[42]))
    assert first is not None
    assert (first.text, first.token_ids, first.chat) == ("Hello", (42,), False)
    [event] = _events(first.events)
    assert (event["id"], event["object"]) == ("cmpl-x", "text_completion")
    choice = event["choices"][0]
    assert (choice["text"], choice["token_ids"], choice["finish_reason"]) == ("Hello", [42], None)


@pytest.mark.parametrize(
    "change",
    [
        {"stream": False},
        {"temperature": 0.7},  # sampled, no seed: the decode would draw another token
        {"temperature": None},
        {"n": 2},
        {"logprobs": 1},
        {"echo": True},
        {"stop": ["lo w"]},  # a stop string may hold the token back
        {"max_tokens": 1},
        {"stream_options": {"continuous_usage_stats": True}},
    ],
)
def test_requests_whose_first_token_the_decode_may_not_repeat_do_not_qualify(
    change: dict[str, Any],
) -> None:
    assert first_token(COMPLETIONS, {**GREEDY, **change}, _answer()) is None


def test_a_seeded_sampled_request_qualifies() -> None:
    body = {**GREEDY, "temperature": 0.8, "seed": 3}
    assert first_token(COMPLETIONS, body, _answer()) is not None


@pytest.mark.parametrize(
    "answer",
    [
        _answer(finish="stop"),  # the prefill stopped: so does the decode
        _answer(text=""),  # part of a character: nothing to show yet
        {"choices": []},
        "not json",
    ],
)
def test_answers_with_nothing_to_send_ahead_do_not_qualify(answer: object) -> None:
    assert first_token(COMPLETIONS, GREEDY, answer) is None


def test_ids_asked_for_but_missing_from_the_answer_do_not_qualify() -> None:
    assert first_token(COMPLETIONS, {**GREEDY, "return_token_ids": True}, _answer()) is None


def test_chat_sends_the_role_then_the_content() -> None:
    body = {**GREEDY, "messages": [{"role": "user", "content": "hi"}]}
    first = first_token(CHAT, body, _chat_answer({"role": "assistant", "content": "Hi"}))
    assert first is not None
    role, content = _events(first.events)
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert content["choices"][0]["delta"] == {"content": "Hi"}
    assert content["object"] == "chat.completion.chunk"
    reasoning = _chat_answer({"role": "assistant", "content": "x", "reasoning": "why"})
    assert first_token(CHAT, body, reasoning) is None


# -- the decode's stream without its first token -------------------------------------------


def _first(ids: bool = True) -> FirstToken:
    body = {**GREEDY, "return_token_ids": True} if ids else GREEDY
    first = first_token(COMPLETIONS, body, _answer(ids=[42] if ids else None))
    assert first is not None
    return first


@pytest.mark.parametrize("piece", [1, 7, 10_000])
def test_the_decode_stream_loses_exactly_its_first_token_however_it_is_cut(piece: int) -> None:
    decode = _completion_stream([("Hello", 42), (" world", 43), ("!", 44)])
    stream = DecodeStream(_first())
    out = b"".join(stream.feed(decode[i : i + piece]) for i in range(0, len(decode), piece))
    assert stream.passing
    assert _texts(out) == [" world", "!"]
    ids = [e["choices"][0]["token_ids"] for e in _events(out) if isinstance(e, dict)]
    assert ids == [[43], [44]]
    assert _events(out)[-1] == "data: [DONE]"


def test_a_first_chunk_carrying_more_than_the_first_token_keeps_the_rest() -> None:
    both = {"index": 0, "text": "Hello world", "token_ids": [42, 43], "finish_reason": None}
    decode = _sse({**HEAD, "choices": [both]}) + _completion_stream([("!", 44)])
    out = DecodeStream(_first()).feed(decode)
    assert _texts(out) == [" world", "!"]
    assert _events(out)[0]["choices"][0]["token_ids"] == [43]


@pytest.mark.parametrize(
    ("pieces", "ids"),
    [([("Goodbye", 42), ("!", 44)], True), ([("Hello", 41), ("!", 44)], True)],
)
def test_a_decode_whose_first_token_is_another_is_refused(
    pieces: list[tuple[str, int]], ids: bool
) -> None:
    with pytest.raises(FirstTokenMismatchError, match="first token"):
        DecodeStream(_first(ids)).feed(_completion_stream(pieces))


def test_a_decode_event_that_is_not_json_is_refused_and_an_empty_one_passes() -> None:
    with pytest.raises(FirstTokenMismatchError, match="not JSON"):
        DecodeStream(_first()).feed(b"data: {not json\n\n")
    endless = DecodeStream(_first())
    endless.feed(b"data: {" + b" " * 1000)
    with pytest.raises(FirstTokenMismatchError, match="without ending an event"):
        endless.feed(b" " * (1 << 20))
    empty = _sse({**HEAD, "choices": [{"index": 0, "text": "", "finish_reason": None}]})
    stream = DecodeStream(_first())
    assert stream.feed(empty) == empty
    assert not stream.passing


def test_a_decode_that_stops_at_the_first_token_is_refused() -> None:
    with pytest.raises(FirstTokenMismatchError, match="stopped"):
        DecodeStream(_first()).feed(_completion_stream([("Hello", 42)]))


def test_chat_drops_the_role_chunk_and_the_first_content() -> None:
    body = {**GREEDY, "messages": [{"role": "user", "content": "hi"}]}
    first = first_token(CHAT, body, _chat_answer({"role": "assistant", "content": "Hi"}))
    assert first is not None

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse({**HEAD, "object": "chat.completion.chunk", "choices": [choice]})

    decode = (
        chunk({"role": "assistant", "content": ""})
        + chunk({"content": "Hi"})
        + chunk({"content": " there"}, "length")
    )
    out = DecodeStream(first).feed(decode + b"data: [DONE]\n\n")
    deltas = [e["choices"][0]["delta"] for e in _events(out) if isinstance(e, dict)]
    assert deltas == [{"content": " there"}]


# -- moriio router over real HTTP ----------------------------------------------------------


@asynccontextmanager
async def _world(
    decode_text: str,
    release: asyncio.Event,
    front: str = "moriio",
    mode: str = "READ",
    prefill_waits: bool = False,
) -> AsyncIterator[str]:
    """A router (``front``: moriio's, or the NIXL peers' proxy) with ``first_token_ahead``
    between stand-in engines. The decode sends its headers at once (as vLLM does) and its
    tokens once ``release`` is set; ``prefill_waits``: the prefill answers only then, and the
    decode does not wait."""
    p_port, d_port, r_port = free_ports(3)

    async def prefill(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert (body["max_tokens"], body["stream"]) == (1, False)
        if prefill_waits:
            await release.wait()
        answer = _answer(ids=[42])
        answer["kv_transfer_params"] = {"remote_block_ids": [1]}
        return web.json_response(answer)

    async def decode(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse()
        out.content_type = "text/event-stream"
        await out.prepare(request)
        if not prefill_waits:
            await release.wait()
        await out.write(_completion_stream([(decode_text, 42), (" world", 43)]))
        return out

    registry = Registry()
    runners = []
    for port, kind, notify, handler in ((p_port, "P", 7005, prefill), (d_port, "D", 7105, decode)):
        instance = parse_announcement(
            {
                "type": kind,
                "http_address": f"127.0.0.1:{port}",
                "zmq_address": f"host:127.0.0.1,handshake:{notify + 300},notify:{notify}",
                "dp_size": 1,
                "tp_size": 1,
                "transfer_mode": mode,
            }
        )
        assert instance is not None
        registry.add(instance)
        app = web.Application()
        app.router.add_post(COMPLETIONS, handler)
        runners.append((web.AppRunner(app), port))
    urls = [f"http://127.0.0.1:{port}" for port in (p_port, d_port)]
    router = Router(registry, None) if front == "moriio" else NixlProxy(urls[:1], urls[1:])
    router.first_token_ahead = True
    runners.append((web.AppRunner(router.app()), r_port))
    for runner, port in runners:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{r_port}"
    finally:
        for runner, _ in runners:
            await runner.cleanup()


async def _client(base: str, release: asyncio.Event) -> tuple[list[Any], Any]:
    """Stream a greedy completion; let the decode answer only once the first token came."""
    body = {**GREEDY, "return_token_ids": True}
    events: list[Any] = []
    async with aiohttp.ClientSession() as session:
        async with session.post(base + COMPLETIONS, json=body) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.strip():
                    events.append(json.loads(line[6:]) if line.startswith(b"data: {") else line)
                    release.set()  # the first token came before the decode answered
        async with session.get(base + "/instances") as resp:
            return events, await resp.json()


@pytest.mark.parametrize("front", ["moriio", "nixl-proxy"])
def test_the_client_gets_the_prefill_token_before_the_decode_answers_then_the_rest(
    front: str,
) -> None:
    async def run() -> tuple[list[Any], Any]:
        release = asyncio.Event()
        async with _world("Hello", release, front) as base:
            return await asyncio.wait_for(_client(base, release), 10)

    events, instances = asyncio.run(run())
    chunks = [e["choices"][0] for e in events if isinstance(e, dict)]
    assert [c["text"] for c in chunks] == ["Hello", " world"]
    assert [c["token_ids"] for c in chunks] == [[42], [43]]
    assert instances["served"] == 1


def test_a_decode_that_computed_another_first_token_ends_the_stream_with_an_error() -> None:
    async def run() -> tuple[list[Any], Any]:
        release = asyncio.Event()
        async with _world("Goodbye", release) as base:
            return await asyncio.wait_for(_client(base, release), 10)

    events, instances = asyncio.run(run())
    assert events[0]["choices"][0]["text"] == "Hello"
    assert "first token" in events[1]["error"]["message"]
    assert events[-1].strip() == b"data: [DONE]"
    assert (instances["first_token_mismatches"], instances["failed"]) == (1, 1)


def test_write_sends_the_token_ahead_when_the_prefill_answers_before_the_decode_streams() -> None:
    async def run() -> tuple[list[Any], Any]:
        release = asyncio.Event()
        async with _world("Hello", release, mode="WRITE") as base:
            return await asyncio.wait_for(_client(base, release), 10)

    events, instances = asyncio.run(run())
    chunks = [e["choices"][0] for e in events if isinstance(e, dict)]
    assert [(c["text"], c["token_ids"]) for c in chunks] == [("Hello", [42]), (" world", [43])]
    assert "stop_reason" in chunks[0]  # the chunk sent ahead (the stand-in decode's have none)
    assert instances["served"] == 1


def test_write_relays_the_decode_as_it_is_when_its_first_token_comes_first() -> None:
    async def run() -> tuple[list[Any], Any]:
        release = asyncio.Event()
        async with _world("Hello", release, mode="WRITE", prefill_waits=True) as base:
            return await asyncio.wait_for(_client(base, release), 10)

    events, instances = asyncio.run(run())
    chunks = [e["choices"][0] for e in events if isinstance(e, dict)]
    assert [(c["text"], c["token_ids"]) for c in chunks] == [("Hello", [42]), (" world", [43])]
    assert "stop_reason" not in chunks[0]  # the decode's own chunk, not the one sent ahead
    assert instances["served"] == 1
