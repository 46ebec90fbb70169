"""A P/D proxy for vLLM's own MooncakeConnector (push), for side-by-side comparisons.

Each request gets a ``transfer_id`` that both legs carry. The prefill gets ``max_tokens=1``
and ``min_tokens=1`` (its one token must end it as length-capped, the only end that keeps
its KV for the decode), no ``stop``, no streaming, and ``kv_transfer_params``
``{do_remote_decode: true, transfer_id}``. Once it answered, the decode gets the client's
request with ``{do_remote_prefill: true, remote_engine_id, remote_bootstrap_addr,
transfer_id}``: it asks the prefill's bootstrap server where that engine's workers are, and
the prefill pushes the KV there. The prefill returns nothing for the decode, and the order
(prefill, then decode) is the NIXL proxy's (:mod:`moriio_tools.serve.nixl_proxy`). Both legs
carry the same ``X-Request-Id``; requests round-robin over fixed engines; the HTTP handling
is :class:`moriio_tools.serve.peer_proxy.PeerProxy`'s.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from moriio.router.legs import one_token_body
from moriio_tools.serve.peer_proxy import PeerProxy, proxy_parser, proxy_process, serve_proxy
from moriio_tools.serve.processes import ManagedProcess


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


class MooncakeProxy(PeerProxy):
    """Prefill, then decode pointed at the prefill's bootstrap server; fixed engines."""

    def __init__(
        self,
        prefill: Sequence[str],
        decode: Sequence[str],
        bootstrap_addr: str,
        engine_id: str,
    ) -> None:
        super().__init__(prefill, decode)
        self.bootstrap_addr = bootstrap_addr
        self.engine_id = engine_id

    def described(self) -> dict[str, Any]:
        return {"bootstrap_addr": self.bootstrap_addr, "engine_id": self.engine_id}

    def prefill_leg(self, body: dict[str, Any], transfer_id: str) -> dict[str, Any]:
        return mooncake_prefill_body(body, transfer_id)

    def decode_leg(self, body: dict[str, Any], transfer_id: str, answer: object) -> dict[str, Any]:
        return mooncake_decode_body(body, transfer_id, self.bootstrap_addr, self.engine_id)


def mooncake_proxy_process(
    port: int,
    prefill_urls: Sequence[str],
    decode_urls: Sequence[str],
    bootstrap_addr: str,
    engine_id: str,
    log_path: Path,
    extra_args: Sequence[str] = (),
) -> ManagedProcess:
    """This module as a process on ``port``."""
    extra = ("--bootstrap-addr", bootstrap_addr, "--engine-id", engine_id, *extra_args)
    engines = (prefill_urls, decode_urls)
    return proxy_process("mooncake-proxy", __name__, port, engines, log_path, extra)


def main(argv: Sequence[str] | None = None) -> int:
    parser = proxy_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap-addr", required=True, help="the prefill's bootstrap server, http://host:port"
    )
    parser.add_argument("--engine-id", required=True, help="the prefill's engine_id")
    args = parser.parse_args(argv)
    proxy = MooncakeProxy(args.prefill, args.decode, args.bootstrap_addr, args.engine_id)
    return serve_proxy(proxy, args)


if __name__ == "__main__":
    sys.exit(main())
