"""What the proxies for vLLM's own connectors (NIXL, Mooncake) share: fixed engines picked
round-robin, the prefill leg first, then the decode leg relayed to the client, all with
:class:`moriio.router.app.Router`'s HTTP handling. A subclass says what each leg carries."""

from __future__ import annotations

import argparse
import sys
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from moriio.router.app import Router
from moriio.router.registry import Registry
from moriio_tools.serve.processes import HOST, ManagedProcess


class PeerProxy(Router, ABC):
    """Prefill, then decode; a fixed set of engines; no hand-off is ever given back."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str]) -> None:
        if not prefill or not decode:
            raise ValueError(f"{type(self).__name__} needs at least one prefill and one decode URL")
        super().__init__(Registry(), None)
        self.prefill = list(prefill)
        self.decode = list(decode)

    @abstractmethod
    def prefill_leg(self, body: dict[str, Any], transfer_id: str) -> dict[str, Any]:
        """The body of the prefill leg."""

    @abstractmethod
    def decode_leg(
        self, body: dict[str, Any], transfer_id: str, answer: object
    ) -> dict[str, Any] | None:
        """The body of the decode leg, given the prefill's answer; None: the answer is no
        hand-off (the client gets a 502)."""

    def described(self) -> dict[str, Any]:
        """What ``GET /instances`` shows besides the engines and the counts."""
        return {}

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200, text="ok")

    async def instances(self, _request: web.Request) -> web.Response:
        data = {"prefill": self.prefill, "decode": self.decode, **self.described()}
        counts = {"served": self.served, "failed": self.failed}
        counts["first_token_mismatches"] = self.first_token_mismatches
        return web.json_response({**data, **counts})

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
        rid = transfer_id = uuid.uuid4().hex
        leg = self.prefill_leg(body, transfer_id)
        status, answer = await self._post_json(prefill + request.path, leg, rid)
        decode_leg = self.decode_leg(body, transfer_id, answer) if status == 200 else None
        if decode_leg is None:
            self.failed += 1
            return web.Response(status=status if status != 200 else 502, text=f"prefill: {answer}")
        first = self._ahead(request.path, body, answer)
        url, ids = decode + request.path, (rid, transfer_id)
        return await self._relay(request, url, decode_leg, ids, first=first)


def proxy_process(
    name: str,
    module: str,
    port: int,
    engines: tuple[Sequence[str], Sequence[str]],
    log_path: Path,
    extra_args: Sequence[str] = (),
) -> ManagedProcess:
    """``python -m module`` serving on ``port`` for the ``(prefill, decode)`` engine URLs."""
    prefill, decode = engines
    argv = [sys.executable, "-m", module, "--port", str(port)]
    argv += [a for url in prefill for a in ("--prefill", url)]
    argv += [a for url in decode for a in ("--decode", url)]
    argv += extra_args
    return ManagedProcess(name, argv, log_path=log_path, ready_url=f"http://{HOST}:{port}/health")


def proxy_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every proxy's ``main`` takes: where to serve, and the engines."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", action="append", required=True, help="prefill engine URL")
    parser.add_argument("--decode", action="append", required=True, help="decode engine URL")
    parser.add_argument(
        "--first-token-ahead", action="store_true", help="as moriio router's --first-token-ahead"
    )
    return parser


def serve_proxy(proxy: PeerProxy, args: argparse.Namespace) -> int:
    """Serve ``proxy`` where ``args`` (from :func:`proxy_parser`) say."""
    proxy.first_token_ahead = args.first_token_ahead
    web.run_app(proxy.app(), host=args.host, port=args.port, print=None)
    return 0
