"""A P/D proxy for vLLM's own NixlConnector (pull), for side-by-side comparisons.

It sends requests the way vLLM's NIXL toy proxy does: the prefill gets ``max_tokens=1``, no
streaming, and ``kv_transfer_params`` ``{do_remote_decode: true}``; its answer's
``kv_transfer_params`` (remote engine, block ids, side channel) go to the decode as they
are, and the decode's response is streamed back. Both legs carry the same ``X-Request-Id``.
The engines are fixed at start (no registration); requests round-robin over them. The HTTP
handling is :class:`moriio_tools.serve.peer_proxy.PeerProxy`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from moriio.router.legs import one_token_body
from moriio_tools.serve.peer_proxy import PeerProxy, proxy_parser, proxy_process, serve_proxy
from moriio_tools.serve.processes import ManagedProcess


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


class NixlProxy(PeerProxy):
    """Prefill, then decode with what the prefill returned; a fixed set of engines."""

    def prefill_leg(self, body: dict[str, Any], transfer_id: str) -> dict[str, Any]:
        return nixl_prefill_body(body)

    def decode_leg(
        self, body: dict[str, Any], transfer_id: str, answer: object
    ) -> dict[str, Any] | None:
        returned = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        return nixl_decode_body(body, returned) if isinstance(returned, dict) else None


def nixl_proxy_process(
    port: int,
    prefill: Sequence[str],
    decode: Sequence[str],
    *,
    log_path: Path,
    extra_args: Sequence[str] = (),
) -> ManagedProcess:
    """This module as a process on ``port``."""
    engines = (prefill, decode)
    return proxy_process("nixl-proxy", __name__, port, engines, log_path, extra_args)


def main(argv: Sequence[str] | None = None) -> int:
    args = proxy_parser(__doc__.splitlines()[0]).parse_args(argv)
    return serve_proxy(NixlProxy(args.prefill, args.decode), args)


if __name__ == "__main__":
    sys.exit(main())
