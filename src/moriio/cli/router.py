"""Run a P/D router that engines register with (vLLM MoRIIO toy proxy protocol)."""

from __future__ import annotations

import argparse
import logging

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
        type=_positive_seconds,
        default=None,
        help="seconds without an announcement before an engine gets no more requests "
        "(default 10; keep it above 3x the engines' proxy_ping_interval)",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from moriio.tools.serve import shutdown
    from moriio.tools.serve.router import serve

    shutdown.install()  # SIGHUP too ends the router cleanly (aiohttp handles INT and TERM)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stale = {} if args.stale_after is None else {"stale_after_s": args.stale_after}
    serve(args.host, args.port, args.ping_host or args.host, args.ping_port, **stale)
    return 0
