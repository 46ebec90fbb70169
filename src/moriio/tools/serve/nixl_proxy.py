"""A P/D proxy for vLLM's own NixlConnector (pull), for side-by-side comparisons.

It sends requests the way vLLM's NIXL toy proxy does: the prefill gets ``max_tokens=1``, no
streaming, and ``kv_transfer_params`` ``{do_remote_decode: true}``; its answer's
``kv_transfer_params`` (remote engine, block ids, side channel) go to the decode as they
are, and the decode's response is streamed back. Both legs carry the same ``X-Request-Id``.
The engines are fixed at start (no registration); requests round-robin over them. The HTTP
handling is :class:`moriio.router.app.Router`'s.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from moriio.router.app import Router
from moriio.router.legs import one_token_body
from moriio.router.registry import Registry
from moriio.tools.serve.processes import HOST, ManagedProcess


def nixl_prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill leg: one token, and a request to keep the KV for a remote decode."""
    out = one_token_body(body)
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return out


def nixl_decode_body(body: Mapping[str, Any], returned: Mapping[str, Any]) -> dict[str, Any]:
    """The decode leg: the client's request with the prefill's ``kv_transfer_params``."""
    out = dict(body)
    out["kv_transfer_params"] = dict(returned)
    return out


class NixlProxy(Router):
    """Prefill, then decode with what the prefill returned; a fixed set of engines."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str]) -> None:
        if not prefill or not decode:
            raise ValueError("NixlProxy needs at least one prefill and one decode URL")
        super().__init__(Registry(), None)  # it gives no hand-off back
        self.prefill = list(prefill)
        self.decode = list(decode)

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200, text="ok")

    async def instances(self, _request: web.Request) -> web.Response:
        data = {"prefill": self.prefill, "decode": self.decode}
        return web.json_response({**data, "served": self.served, "failed": self.failed})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="request body must be JSON")
        if not isinstance(body, dict):
            return web.Response(status=400, text="request body must be a JSON object")
        turn = next(self._counter)
        prefill = self.prefill[turn % len(self.prefill)]
        decode = self.decode[turn % len(self.decode)]
        rid = uuid.uuid4().hex
        status, answer = await self._post_json(prefill + request.path, nixl_prefill_body(body), rid)
        returned = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if status != 200 or not isinstance(returned, dict):
            self.failed += 1
            return web.Response(status=status if status != 200 else 502, text=f"prefill: {answer}")
        return await self._relay(
            request, decode + request.path, nixl_decode_body(body, returned), (rid, rid)
        )


def nixl_proxy_process(
    port: int, prefill: Sequence[str], decode: Sequence[str], *, log_path: Path
) -> ManagedProcess:
    """This module as a process on ``port``."""
    argv = [sys.executable, "-m", __name__, "--port", str(port)]
    argv += [a for url in prefill for a in ("--prefill", url)]
    argv += [a for url in decode for a in ("--decode", url)]
    return ManagedProcess(
        "nixl-proxy", argv, log_path=log_path, ready_url=f"http://{HOST}:{port}/health"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", action="append", required=True, help="prefill engine URL")
    parser.add_argument("--decode", action="append", required=True, help="decode engine URL")
    args = parser.parse_args(argv)
    proxy = NixlProxy(args.prefill, args.decode)
    web.run_app(proxy.app(), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
