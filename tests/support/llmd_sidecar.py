"""llm-d's routing sidecar, nixlv2 connector, transcribed request for request.

From ``pkg/sidecar/proxy/connector_nixlv2.go`` (llm-d-router ebab687): the plain nixlv2
READ flow, the MoRIIO WRITE serial flow (``--moriio-write-mode``) and the MoRIIO WRITE
parallel flow (``--moriio-parallel-dispatch``), with the same bodies, headers, token limits,
DP-rank pinning (``pickDPRank``: blake2s-256 of the request id), decode-leg backfill and
prefill retries on 502/503/504. An aiohttp app a client posts ``/v1/completions`` to.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens")
RETRYABLE = frozenset({502, 503, 504})
KV_WAIT_BACKSTOP_S = 30.0


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    prefill_url: str  # http://HOST:PORT of the prefill pod
    decode_url: str  # the local decoder
    decode_pod_ip: str
    write_mode: bool = False  # --moriio-write-mode
    parallel_dispatch: bool = False  # --moriio-parallel-dispatch
    decode_notify_port: int = 0
    decode_handshake_port: int = 0
    prefill_notify_port: int = 0
    prefill_handshake_port: int = 0
    tp_size: int = 1  # --moriio-tp-size
    dp_size: int = 1  # --moriio-dp-size
    dp_size_local: int = 0  # --moriio-dp-size-local
    decode_hosts: tuple[str, ...] = ()  # Wide-EP: decode pod IPs
    remote_hosts: tuple[str, ...] = ()  # Wide-EP: prefill pod IPs
    prefill_max_retries: int = 2
    prefill_retry_backoff_s: float = 0.2


def pick_dp_rank(request_id: str, dp_size: int) -> int:
    if dp_size <= 1:
        return 0
    digest = hashlib.blake2s(request_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % dp_size


def resolve_decode_dp_rank(returned: Any, request_id: str, dp_size: int) -> int:
    fallback = pick_dp_rank(request_id, dp_size)
    if dp_size <= 1 or not isinstance(returned, dict):
        return fallback
    rank = returned.get("remote_dp_rank")
    if isinstance(rank, bool) or not isinstance(rank, int | float) or rank != int(rank):
        return fallback
    return int(rank) if 0 <= rank < dp_size else fallback


@dataclass
class Sidecar:
    config: SidecarConfig
    statuses: list[tuple[str, int]] = field(default_factory=list)  # (leg, HTTP status)
    request_ids: Iterator[str] | None = None  # the ``x-request-id``s to use (uuid1 after)
    _session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.handle)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        return self._session

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        request_uuid = next(self.request_ids, None) if self.request_ids is not None else None
        request_uuid = request_uuid or str(uuid.uuid1())
        if self.config.write_mode and self.config.parallel_dispatch:
            return await self._write_parallel(request, body, request_uuid)
        return await self._serial(request, body, request_uuid)

    # -------------------------------------------------------------- serial (READ / WRITE)

    def _prefill_params(self, rank: int, transfer_id: str) -> dict[str, Any]:
        c = self.config
        params: dict[str, Any] = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": c.decode_pod_ip,
            "remote_port": None,
            "remote_notify_port": c.decode_notify_port,
            "remote_dp_rank": rank,
            "remote_dp_rank_override": True,
            "remote_handshake_port": c.decode_handshake_port,
            "transfer_id": transfer_id,
            "tp_size": c.tp_size,
            "remote_dp_size": c.dp_size,
        }
        if c.decode_hosts:
            params["remote_hosts"] = list(c.decode_hosts)
            if c.dp_size_local > 0:
                params["remote_dp_size_local"] = c.dp_size_local
        return params

    async def _serial(
        self, request: web.Request, body: dict[str, Any], request_uuid: str
    ) -> web.StreamResponse:
        c = self.config
        rank = pick_dp_rank(request_uuid, c.dp_size)
        headers = {"x-request-id": request_uuid}
        if c.dp_size > 1:
            headers["x-data-parallel-rank"] = str(rank)
        prefill = copy.deepcopy(body)
        if c.write_mode:
            prefill["kv_transfer_params"] = self._prefill_params(rank, "tx" + request_uuid)
        else:
            prefill["kv_transfer_params"] = {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            }
        prefill["stream"] = False
        prefill.pop("stream_options", None)
        for name in TOKEN_LIMIT_FIELDS:
            prefill[name] = 1
        status, text = await self._prefill_with_retries(prefill, headers)
        if status >= 400:
            return web.Response(status=status, text=text)
        returned = json.loads(text).get("kv_transfer_params")
        decode = copy.deepcopy(body)
        d_headers = {"x-request-id": request_uuid}
        if c.write_mode:
            decode_rank = resolve_decode_dp_rank(returned, request_uuid, c.dp_size)
            if isinstance(returned, dict):
                returned["remote_dp_rank"] = decode_rank
                returned["remote_dp_rank_override"] = True
                self._backfill(returned, request_uuid)
            if c.dp_size > 1:
                d_headers["x-data-parallel-rank"] = str(decode_rank)
        decode["kv_transfer_params"] = returned
        return await self._relay(request, decode, d_headers)

    def _backfill(self, params: dict[str, Any], request_uuid: str) -> None:
        c = self.config
        params.setdefault("transfer_id", "tx" + request_uuid)
        params.setdefault("remote_notify_port", c.decode_notify_port)
        if "remote_dp_rank" not in params:
            params["remote_dp_rank"] = pick_dp_rank(request_uuid, c.dp_size)
            params["remote_dp_rank_override"] = True
        params.setdefault("remote_handshake_port", c.decode_handshake_port)
        params.setdefault("remote_dp_size", c.dp_size)
        if c.remote_hosts:
            params.setdefault("remote_hosts", list(c.remote_hosts))
            if c.dp_size_local > 0:
                params.setdefault("remote_dp_size_local", c.dp_size_local)

    async def _prefill_with_retries(
        self, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, str]:
        attempt = 0
        while True:
            status, text = await self._post(self.config.prefill_url, body, headers)
            self.statuses.append(("prefill", status))
            if status < 400 or status not in RETRYABLE:
                return status, text
            if attempt >= self.config.prefill_max_retries:
                return status, text
            attempt += 1
            await asyncio.sleep(self.config.prefill_retry_backoff_s)

    # ------------------------------------------------------------------- parallel WRITE

    async def _write_parallel(
        self, request: web.Request, body: dict[str, Any], request_uuid: str
    ) -> web.StreamResponse:
        c = self.config
        transfer_id = "tx" + request_uuid
        rank = pick_dp_rank(request_uuid, c.dp_size)
        prefill = copy.deepcopy(body)
        prefill["kv_transfer_params"] = self._prefill_params(rank, transfer_id)
        prefill["stream"] = False
        prefill.pop("stream_options", None)
        for name in ("max_tokens", "max_completion_tokens", "max_output_tokens", "min_tokens"):
            prefill[name] = 1
        prefill_host = c.prefill_url.split("//", 1)[1].rsplit(":", 1)[0]
        decode = copy.deepcopy(body)
        decode["kv_transfer_params"] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": f"{prefill_host}:{c.prefill_handshake_port}",
            "remote_block_ids": [],
            "remote_host": prefill_host,
            "remote_port": c.prefill_handshake_port,
            "remote_notify_port": c.prefill_notify_port,
            "remote_dp_rank": rank,
            "remote_dp_rank_override": True,
            "remote_handshake_port": c.prefill_handshake_port,
            "transfer_id": transfer_id,
            "tp_size": c.tp_size,
            "remote_dp_size": c.dp_size,
        }
        if c.remote_hosts:
            decode["kv_transfer_params"]["remote_hosts"] = list(c.remote_hosts)
            if c.dp_size_local > 0:
                decode["kv_transfer_params"]["remote_dp_size_local"] = c.dp_size_local
        headers = {"x-request-id": request_uuid}
        if c.dp_size > 1:
            headers["x-data-parallel-rank"] = str(rank)
        prefill_call = asyncio.ensure_future(self._post(c.prefill_url, prefill, headers))
        decode_call = asyncio.ensure_future(self._post(c.decode_url, decode, headers))
        done, _ = await asyncio.wait({prefill_call}, timeout=KV_WAIT_BACKSTOP_S)
        if not done:
            prefill_call.cancel()
            decode_call.cancel()
            return web.Response(status=504, text="prefill did not complete")
        status, text = prefill_call.result()
        self.statuses.append(("prefill", status))
        if status >= 400:
            decode_call.cancel()  # the KV will never arrive: abort the decode
            return web.Response(status=status, text=text)
        d_status, d_text = await decode_call  # buffered, committed once the prefill succeeded
        self.statuses.append(("decode", d_status))
        return web.Response(status=d_status, text=d_text, content_type="text/event-stream")

    # ---------------------------------------------------------------------------- HTTP

    async def _post(
        self, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, str]:
        try:
            async with self._client().post(
                url + "/v1/completions", json=body, headers=headers
            ) as resp:
                return resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return 502, str(exc)

    async def _relay(
        self, request: web.Request, body: dict[str, Any], headers: dict[str, str]
    ) -> web.StreamResponse:
        async with self._client().post(
            self.config.decode_url + "/v1/completions", json=body, headers=headers
        ) as resp:
            self.statuses.append(("decode", resp.status))
            out = web.StreamResponse(status=resp.status)
            out.content_type = resp.content_type
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
