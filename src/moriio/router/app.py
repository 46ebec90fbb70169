"""``moriio router``: an OpenAI-compatible P/D router for moriio (and vLLM's MoRIIO connector).

It does what vLLM's MoRIIO toy proxy does, with the same registration protocol
(:mod:`moriio.domain.protocol.announcement`) and the same request flow:

* a ``transfer_id`` (32 hex digits) shared by both legs, and a request id embedding both
  engines' control addresses, ``___prefill_addr_<zmq>___decode_addr_<zmq>_<transfer_id>``,
  sent as ``X-Request-Id``;
* the prefill gets ``max_tokens=1``, ``stream=false`` and ``kv_transfer_params``
  ``{do_remote_decode: true, remote_host/handshake/notify of the decode, remote_tp_size,
  remote_dp_size}``;
* READ: the decode request is sent once the prefill answered, with its
  ``kv_transfer_params`` (block ids, engine id, lease, ...) and ``do_remote_prefill``;
* WRITE: prefill and decode are dispatched together; the decode gets the prefill's address;
  a prefill that fails cuts the decode short (its KV will never come) and the client gets
  the prefill's status;
* each leg names a DP rank of its engine in ``X-data-parallel-rank`` (round-robin over the
  registered ``dp_size``) and the other engine's in ``remote_dp_rank``; in READ the decode
  dials the rank the prefill returned.

Unlike the toy proxy it keeps the client's ``max_tokens`` for the decode, round-robins over
every registered instance, passes every field the prefill returned, and answers a failed
prefill with its HTTP status instead of hanging the decode. ``GET /instances`` lists the
registry; ``GET /health`` answers 200 once at least one P and one D registered.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from moriio.domain.protocol.messages import Message
from moriio.log import get_logger
from moriio.ports import ControlChannel
from moriio.router.first_token import (
    DecodeStream,
    FirstToken,
    FirstTokenMismatchError,
    ahead_of,
    decode_chunks,
    error_event,
    first_of,
    first_token,
    open_stream,
)
from moriio.router.handoffs import HandoffReturns
from moriio.router.legs import decode_body, prefill_body, request_id
from moriio.router.registry import Registry
from moriio.timeline import Timeline

log = get_logger("moriio.router")

REQUEST_TIMEOUT_S = 600.0
ENGINE_KEEPALIVE_S = 2.0  # an idle connection to an engine is reused for at most this long
ENGINE_CONNECTIONS = 0  # open connections per engine at most; 0: one per request in flight
CLIENT_ID_MAX = 128  # characters of a client's X-Request-Id kept in the timeline


class Router:
    """The HTTP side: picks a P/D pair per request and relays the decode's response."""

    def __init__(
        self,
        registry: Registry,
        open_release_channel: Callable[[], ControlChannel[Message]] | None,
        timeline: Timeline | None = None,
        *,
        first_token_ahead: bool = False,
        engine_connections: int = ENGINE_CONNECTIONS,
    ) -> None:
        """``open_release_channel``: opens the channel that gives hand-offs back (see
        :mod:`moriio.router.handoffs`); None: none is given back, each ends at its lease.
        ``timeline``: records each request's ``router.*`` events (:mod:`moriio.timeline`).
        ``first_token_ahead``: stream the prefill's first token to the client before the
        decode's (see :mod:`moriio.router.first_token`).
        ``engine_connections``: connections open to one engine at most (0: no bound); the
        requests beyond wait in the router. Each engine has its own bound, so streams held open
        by decodes never keep a prefill leg waiting."""
        if engine_connections < 0:
            raise ValueError(f"engine_connections must be 0 or more, got {engine_connections}")
        self.registry = registry
        self.engine_connections = engine_connections
        self.first_token_ahead = first_token_ahead
        self.first_token_mismatches = 0
        self.timeline = timeline or Timeline(None, "router")
        self._counter = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self.served = 0
        self.failed = 0
        self.handoffs = HandoffReturns(open_release_channel)
        self._pending: set[asyncio.Future[None]] = set()  # hand-off checks running

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/instances", self.instances)
        app.router.add_get("/health", self.health)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        self.handoffs.close()
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
            # Idle connections are dropped before the engines' server drops them (uvicorn,
            # 5 s): one reused just as the server closes it fails the request it carries.
            # aiohttp's default bounds a session at 100 connections over all hosts: at 100
            # decode streams in flight, every prefill leg would queue behind them.
            connector = aiohttp.TCPConnector(
                limit=0,
                limit_per_host=self.engine_connections,
                keepalive_timeout=ENGINE_KEEPALIVE_S,
            )
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self._session

    async def instances(self, _request: web.Request) -> web.Response:
        data = {
            **self.registry.to_json(),
            "served": self.served,
            "failed": self.failed,
            "handoffs_given_back": self.handoffs.sent,
            "first_token_mismatches": self.first_token_mismatches,
        }
        return web.json_response(data)

    async def health(self, _request: web.Request) -> web.Response:
        prefill, decode, _ = self.registry.snapshot()
        ready = bool(prefill and decode)
        return web.Response(status=200 if ready else 503, text="ok" if ready else "waiting")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        prefill_pool, decode_pool, mode = self.registry.snapshot()
        if not prefill_pool or not decode_pool:
            return web.Response(status=503, text=self._unavailable())
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.Response(status=400, text="request body must be JSON")
        if not isinstance(body, dict):
            return web.Response(status=400, text="request body must be a JSON object")
        turn = next(self._counter)
        prefill = prefill_pool[turn % len(prefill_pool)]
        decode = decode_pool[turn % len(decode_pool)]
        # One DP rank of each engine per request, named in the header vLLM routes by and in
        # the params the other engine dials by.
        p_rank, d_rank = turn % prefill.dp_size, turn % decode.dp_size
        transfer_id = uuid.uuid4().hex
        client_id = request.headers.get("X-Request-Id", "")[:CLIENT_ID_MAX]
        self.timeline.record("router.received", transfer_id, client=client_id)
        rid = request_id(prefill, decode, transfer_id)
        path = request.path
        prefill_call = asyncio.ensure_future(
            self._post_json(
                prefill.url + path, prefill_body(body, decode, transfer_id, d_rank), rid, p_rank
            )
        )
        if mode != "READ":
            decode_call = decode_body(body, prefill, transfer_id, None, p_rank)

            def cancel_handoff(refused: bool) -> None:  # refused or not: see handoffs
                self.handoffs.give_back(prefill, decode_call["kv_transfer_params"], p_rank)

            return await self._write_pair(
                request,
                prefill_call,
                decode.url + path,
                decode_call,
                (rid, transfer_id),
                d_rank,
                cancel_handoff,
            )
        started = time.monotonic()
        status, answer = await prefill_call
        self.timeline.record("router.prefill_answered", transfer_id)
        log.debug(  # one per request: INFO would flood a busy router's log
            "prefill answered",
            transfer_id=transfer_id,
            request_id=rid,
            peer=prefill.url,
            status=status,
            seconds=round(time.monotonic() - started, 3),
        )
        if status != 200:
            self.failed += 1
            return web.Response(status=status, text=f"prefill failed: {answer}")
        returned = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        decode_call = decode_body(body, prefill, transfer_id, returned, p_rank)
        rank = decode_call["kv_transfer_params"].get("remote_dp_rank", p_rank)

        def return_handoff(refused: bool) -> None:  # only to a decode that cannot read it
            if not isinstance(rank, int):
                return
            params = decode_call["kv_transfer_params"]
            if refused:
                self.handoffs.give_back(prefill, params, rank)
            else:
                check = asyncio.ensure_future(
                    self.handoffs.give_back_if_gone(decode, prefill, params, rank)
                )
                self._pending.add(check)  # (a task only weakly referenced may be collected)
                check.add_done_callback(self._pending.discard)

        url = decode.url + path
        ids = (rid, transfer_id)
        first = self._ahead(path, body, answer)
        return await self._relay(
            request, url, decode_call, ids, d_rank, [], return_handoff, first=first
        )

    def _ahead(self, path: str, body: Mapping[str, Any], answer: object) -> FirstToken | None:
        """The prefill's first token to stream before the decode's, if enabled and eligible."""
        return first_token(path, body, answer) if self.first_token_ahead else None

    async def _write_pair(
        self,
        request: web.Request,
        prefill_call: asyncio.Future[tuple[int, Any]],
        url: str,
        body: dict[str, Any],
        ids: tuple[str, str],
        rank: int,
        on_decode_failed: Callable[[bool], None],
    ) -> web.StreamResponse:
        """WRITE: relay the decode, dispatched with its prefill; a failed prefill cuts the
        decode short (its KV will never come) and answers with the prefill's status."""
        prepared: list[web.StreamResponse] = []
        ahead = None
        if self.first_token_ahead:
            ahead = asyncio.ensure_future(ahead_of(prefill_call, request.path, body))
        relay = asyncio.ensure_future(
            self._relay(request, url, body, ids, rank, prepared, on_decode_failed, ahead=ahead)
        )
        legs: list[asyncio.Future[Any]] = [prefill_call, relay]
        await asyncio.wait(legs, return_when=asyncio.FIRST_COMPLETED)
        if not prefill_call.done():  # the decode ended first
            response: web.StreamResponse | None = await relay
            status, answer = await prefill_call
        else:
            status, answer = prefill_call.result()
            if status != 200:
                relay.cancel()
            try:
                response = await relay
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the client went away: not ours to swallow
                response = None
        if status != 200:
            self.failed += 1
            log.warning("prefill failed", request_id=ids[0], status=status, answer=answer)
        if response is not None:
            return response
        if prepared:  # headers already sent: the client sees a cut stream
            if request.transport is not None:
                request.transport.close()
            return prepared[0]
        return web.Response(status=status, text=f"prefill failed: {answer}")

    def _unavailable(self) -> str:
        registry = self.registry
        if registry.prefill and registry.decode:
            return (
                "Service Unavailable: no live prefill or decode instance (the registered ones "
                f"have not announced themselves for over {registry.stale_after_s:g} s)."
            )
        return "Service Unavailable: No prefill or decode instances are registered."

    async def _post_json(
        self, url: str, body: dict[str, Any], rid: str, rank: int | None = None
    ) -> tuple[int, Any]:
        try:
            async with self._client().post(url, json=body, headers=_headers(rid, rank)) as resp:
                text = await resp.text()
                try:
                    return resp.status, json.loads(text)
                except json.JSONDecodeError:
                    return resp.status, text
        except (aiohttp.ClientError, TimeoutError) as exc:
            return 502, str(exc)

    async def _relay(
        self,
        request: web.Request,
        url: str,
        body: dict[str, Any],
        ids: tuple[str, str],
        rank: int | None = None,
        prepared: list[web.StreamResponse] | None = None,
        on_failed: Callable[[bool], None] | None = None,
        *,
        first: FirstToken | None = None,
        ahead: asyncio.Future[FirstToken | None] | None = None,
    ) -> web.StreamResponse:
        """Stream the decode's answer; ``ids``: the request and transfer ids; ``prepared``
        gets the response once headers are sent; ``on_failed(refused)`` runs when the decode
        leg fails (``refused``: the decode never got the request); ``first``: the prefill's
        first token, sent before the decode leg and taken out of the decode's stream;
        ``ahead`` (WRITE): that token once the prefill answered, sent only if it comes before
        the decode's first bytes."""
        rid, transfer_id = ids
        out: web.StreamResponse | None = None
        stream: DecodeStream | None = None
        if first is not None:
            out = await open_stream(request, first)
            if prepared is not None:
                prepared.append(out)
            self.timeline.record("router.ahead", transfer_id)
            stream = DecodeStream(first)
        self.timeline.record("router.decode_sent", transfer_id)
        try:
            async with self._client().post(url, json=body, headers=_headers(rid, rank)) as resp:
                if out is None:
                    out = web.StreamResponse(status=resp.status)
                    out.content_type = resp.content_type
                    await out.prepare(request)
                    if prepared is not None:
                        prepared.append(out)
                elif resp.status != 200:
                    text = (await resp.text())[:300]
                    await out.write(error_event(f"decode failed: HTTP {resp.status}: {text}"))
                first_read = None
                if ahead is not None and resp.status == 200:
                    first_read, token = await first_of(resp.content, ahead)
                    if token is not None:
                        await out.write(token.events)
                        self.timeline.record("router.ahead", transfer_id)
                        stream = DecodeStream(token)
                chunks = 0
                async for raw in decode_chunks(first_read, resp.content):
                    if not chunks:
                        self.timeline.record("router.first_chunk", transfer_id)
                    chunks += 1
                    chunk = raw
                    if stream is not None and not stream.passing and resp.status == 200:
                        try:
                            chunk = stream.feed(raw)
                        except FirstTokenMismatchError as exc:
                            self.failed += 1
                            self.first_token_mismatches += 1
                            log.error("first token sent ahead was not the decode's", error=str(exc))
                            await out.write(error_event(str(exc)))
                            await out.write_eof()
                            return out
                    if chunk:
                        await out.write(chunk)
                await out.write_eof()
                self.timeline.record("router.done", transfer_id, chunks=chunks)
                if resp.status == 200:
                    self.served += 1
                else:
                    self.failed += 1
                    if on_failed is not None:
                        on_failed(False)
                return out
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.failed += 1
            log.warning("decode failed", request_id=rid, error=str(exc))
            if on_failed is not None:
                on_failed(isinstance(exc, aiohttp.ClientConnectorError))
            if out is not None:  # headers already sent: the client sees a cut stream
                return out
            return web.Response(status=502, text=f"decode failed: {exc}")


def _headers(rid: str, rank: int | None) -> dict[str, str]:
    if rank is None:
        return {"X-Request-Id": rid}
    return {"X-Request-Id": rid, "X-data-parallel-rank": str(rank)}
