"""A P/D proxy for vLLM's own MooncakeConnector (push), for side-by-side comparisons.

Each request gets a ``transfer_id`` that both legs carry. The prefill gets ``max_tokens=1``
and ``min_tokens=1`` (its one token must end it as length-capped, the only end that keeps
its KV for the decode), no ``stop``, no streaming, and ``kv_transfer_params``
``{do_remote_decode: true, transfer_id}``. Once it answered, the decode gets the client's
request with ``{do_remote_prefill: true, remote_engine_id, remote_bootstrap_addr,
transfer_id}``: it asks the prefill's bootstrap server where that engine's workers are, and
the prefill pushes the KV there. The prefill returns nothing for the decode, and the order
(prefill, then decode) is the NIXL proxy's (:mod:`moriio.tools.serve.nixl_proxy`). Both legs
carry the same ``X-Request-Id``; requests round-robin over fixed engines; the HTTP handling
is :class:`moriio.router.app.Router`'s.
"""

from __future__ import annotations

import argparse
import copy
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


def mooncake_prefill_body(body: Mapping[str, Any], transfer_id: str) -> dict[str, Any]:
    """The prefill leg: exactly one token, and a request to keep the KV for a remote decode."""
    out = one_token_body(body)
    out["min_tokens"] = 1
    out.pop("stop", None)
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "transfer_id": transfer_id,
    }
    return out


def mooncake_decode_body(
    body: Mapping[str, Any], transfer_id: str, bootstrap_addr: str, engine_id: str
) -> dict[str, Any]:
    """The decode leg: the client's request, naming the prefill engine and its bootstrap
    server (``http://host:port``)."""
    out = copy.deepcopy(dict(body))
    out["kv_transfer_params"] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine_id,
        "remote_bootstrap_addr": bootstrap_addr,
        "transfer_id": transfer_id,
    }
    return out


class MooncakeProxy(Router):
    """Prefill, then decode pointed at the prefill's bootstrap server; fixed engines."""

    def __init__(
        self,
        prefill: Sequence[str],
        decode: Sequence[str],
        bootstrap_addr: str,
        engine_id: str,
    ) -> None:
        if not prefill or not decode:
            raise ValueError("MooncakeProxy needs at least one prefill and one decode URL")
        super().__init__(Registry(), None)  # it gives no hand-off back
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.bootstrap_addr = bootstrap_addr
        self.engine_id = engine_id

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200, text="ok")

    async def instances(self, _request: web.Request) -> web.Response:
        data = {
            "prefill": self.prefill,
            "decode": self.decode,
            "bootstrap_addr": self.bootstrap_addr,
            "engine_id": self.engine_id,
        }
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
        transfer_id = uuid.uuid4().hex
        leg = mooncake_prefill_body(body, transfer_id)
        status, answer = await self._post_json(prefill + request.path, leg, rid)
        if status != 200:
            self.failed += 1
            return web.Response(status=status, text=f"prefill: {answer}")
        decode_leg = mooncake_decode_body(body, transfer_id, self.bootstrap_addr, self.engine_id)
        return await self._relay(request, decode + request.path, decode_leg, (rid, transfer_id))


def mooncake_proxy_process(
    port: int,
    prefill_urls: Sequence[str],
    decode_urls: Sequence[str],
    bootstrap_addr: str,
    engine_id: str,
    log_path: Path,
) -> ManagedProcess:
    """This module as a process on ``port``."""
    argv = [sys.executable, "-m", __name__, "--port", str(port)]
    argv += [a for url in prefill_urls for a in ("--prefill", url)]
    argv += [a for url in decode_urls for a in ("--decode", url)]
    argv += ["--bootstrap-addr", bootstrap_addr, "--engine-id", engine_id]
    return ManagedProcess(
        "mooncake-proxy", argv, log_path=log_path, ready_url=f"http://{HOST}:{port}/health"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", action="append", required=True, help="prefill engine URL")
    parser.add_argument("--decode", action="append", required=True, help="decode engine URL")
    parser.add_argument(
        "--bootstrap-addr", required=True, help="the prefill's bootstrap server, http://host:port"
    )
    parser.add_argument("--engine-id", required=True, help="the prefill's engine_id")
    args = parser.parse_args(argv)
    proxy = MooncakeProxy(args.prefill, args.decode, args.bootstrap_addr, args.engine_id)
    web.run_app(proxy.app(), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
