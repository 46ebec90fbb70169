"""Run a P/D router that engines register with (vLLM MoRIIO toy proxy protocol)."""

from __future__ import annotations

import argparse
import logging

from moriio.tools.serve.registry import DEFAULT_STALE_AFTER_S

DEFAULT_PING_PORT = 36367  # the MoRIIO toy proxy's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on")
    parser.add_argument("--port", type=int, default=10001, help="HTTP port (OpenAI API)")
    parser.add_argument("--ping-host", default=None, help="registration address (default: --host)")
    parser.add_argument(
        "--ping-port",
        type=int,
        default=DEFAULT_PING_PORT,
        help="ZMQ port engines announce themselves on (their proxy_ping_port)",
    )
    parser.add_argument(
        "--stale-after",
        type=float,
        default=DEFAULT_STALE_AFTER_S,
        help="seconds without an announcement before an engine gets no more requests "
        "(keep it above 3x the engines' proxy_ping_interval)",
    )


def run(args: argparse.Namespace) -> int:
    from moriio.tools.serve.router import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(args.host, args.port, args.ping_host or args.host, args.ping_port, args.stale_after)
    return 0
