"""Run a P/D router that engines register with (vLLM MoRIIO toy proxy protocol)."""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moriio.domain.protocol.messages import Message
    from moriio.ports import ControlChannel

DEFAULT_PING_PORT = 36367  # the MoRIIO toy proxy's
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error")
MISSING_AIOHTTP = (
    "moriio router: error: aiohttp is not installed; install the router extra: "
    "pip install 'moriio[router]'"
)


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
        "--first-token-ahead",
        action="store_true",
        help="stream the prefill's first token to the client as soon as it answers, before the "
        "decode's stream (greedy or seeded streamed requests; checked against the decode's)",
    )
    parser.add_argument(
        "--engine-connections",
        type=_connections,
        default=0,
        help="connections open to one engine at most; requests beyond wait in the router "
        "(default 0: no bound, the engines queue what they cannot run yet)",
    )
    parser.add_argument(
        "--stale-after",
        type=_positive_seconds,
        default=None,
        help="seconds without an announcement before an engine gets no more requests "
        "(default 10; keep it above 3x the engines' proxy_ping_interval)",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="debug adds a line per request and aiohttp's access log",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _connections(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, got {text!r}")
    return value


def open_release_channel() -> ControlChannel[Message]:
    """The channel ``moriio router`` gives hand-offs back on: ZMQ, as engines listen."""
    from moriio.adapters.zmq.channel import ZmqControlChannel
    from moriio.domain.protocol.codec import WIRE_CODEC

    return ZmqControlChannel(WIRE_CODEC, "127.0.0.1", 0, trust_any=True)


def listening_line(args: argparse.Namespace) -> str:
    """The start-up line: where clients and engines reach the router."""
    return (
        f"listening on http://{_url_host(args.host)}:{args.port} (OpenAI API); engines "
        f"register on tcp://{_url_host(args.ping_host or args.host)}:{args.ping_port}"
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run(args: argparse.Namespace) -> int:
    if find_spec("aiohttp") is None:
        print(MISSING_AIOHTTP, file=sys.stderr)
        return 2
    from aiohttp import web

    from moriio.cli import shutdown
    from moriio.log import get_logger
    from moriio.router.app import Router
    from moriio.router.ping import PingListener
    from moriio.router.registry import Registry
    from moriio.timeline import Timeline

    shutdown.install()  # SIGHUP too ends the router cleanly (aiohttp handles INT and TERM)
    level = getattr(logging, args.log_level.upper())
    logging.basicConfig(level=level, format=LOG_FORMAT)
    log = get_logger("moriio.router")
    stale = {} if args.stale_after is None else {"stale_after_s": args.stale_after}
    registry = Registry(**stale)
    listener = PingListener(registry, args.ping_host or args.host, args.ping_port)
    listener.start()
    try:
        router = Router(
            registry,
            open_release_channel,
            Timeline.from_env("router"),
            first_token_ahead=args.first_token_ahead,
            engine_connections=args.engine_connections,
        )
        web.run_app(
            router.app(),
            host=args.host,
            port=args.port,
            print=lambda _banner: log.info(listening_line(args)),  # once the sockets listen
            access_log=logging.getLogger("aiohttp.access") if level <= logging.DEBUG else None,
        )
    finally:
        listener.stop()
    return 0
