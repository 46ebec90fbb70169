"""ZMQ socket construction and bounded receives shared by the listener and the senders."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import zmq
from structlog.typing import FilteringBoundLogger

from moriio.adapters.zmq.framing import Reason
from moriio.ports import PeerAddress

MAX_PARTS_KEPT: Final = 4
_LOG_BURST: Final = 10
_LOG_EVERY: Final = 1000


def should_log(count: int) -> bool:
    """Rate limit for repeated warnings: the first few, then one per thousand."""
    return count <= _LOG_BURST or count % _LOG_EVERY == 0


class Rejections:
    """Thread-safe counts of dropped inbound messages by reason, logged with a rate limit."""

    def __init__(self, log: FilteringBoundLogger) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._log = log

    def add(self, reason: Reason, detail: str, **context: str) -> None:
        """Count one rejection and log it (the first ten per reason, then every 1000th)."""
        with self._lock:
            self._counts[reason.value] += 1
            count = self._counts[reason.value]
        if should_log(count):
            self._log.warning(
                "control message rejected",
                reason=reason.value,
                detail=detail[:200],
                count=count,
                **context,
            )

    def snapshot(self) -> Mapping[str, int]:
        """The counts now."""
        with self._lock:
            return MappingProxyType(dict(self._counts))


def endpoint(host: str, port: int | str) -> str:
    """A ZMQ TCP endpoint; IPv6 literals get brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def bind_router(
    ctx: zmq.Context[zmq.Socket[bytes]], host: str, port: int, max_msg: int, hwm: int
) -> zmq.Socket[bytes]:
    """A ROUTER bound to ``host:port`` (0: ephemeral) that cuts frames over ``max_msg``."""
    router = ctx.socket(zmq.ROUTER)
    try:
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, max_msg)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, hwm)
        if ":" in host:
            router.setsockopt(zmq.IPV6, 1)
        router.bind(endpoint(host, port or "*"))
    except BaseException:
        router.close(linger=0)
        raise
    return router


def bound_port(router: zmq.Socket[bytes]) -> int:
    """The TCP port ``router`` is bound to."""
    return int(router.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])


def connect_dealer(
    ctx: zmq.Context[zmq.Socket[bytes]], peer: PeerAddress, max_msg: int, hwm: int
) -> zmq.Socket[bytes]:
    """A DEALER to ``peer`` that queues up to ``hwm`` messages while (re)connecting.

    ``IMMEDIATE`` stays off so that messages sent right after connecting wait for the
    connection instead of failing; ZMQ reconnects on its own (100 ms, backing off to 5 s).
    """
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.IMMEDIATE, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_msg)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)  # a restarted peer is reached within 0.5 s
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 30)
    if ":" in peer.host:
        sock.setsockopt(zmq.IPV6, 1)
    sock.connect(endpoint(peer.host, peer.port))
    return sock


def recv_parts(sock: zmq.Socket[bytes]) -> tuple[list[zmq.Frame], int]:
    """Read one multipart message without blocking, keeping at most a few parts.

    Returns (kept parts, total part count); raises ``zmq.Again`` when nothing is queued.
    """
    kept: list[zmq.Frame] = []
    total = 0
    while True:
        frame = sock.recv(zmq.NOBLOCK, copy=False)
        total += 1
        if len(kept) < MAX_PARTS_KEPT:
            kept.append(frame)
        if not frame.more:
            return kept, total


def peer_of(frame: zmq.Frame) -> str:
    """The remote IP a frame came from, for logs ("?" when unknown)."""
    try:
        return str(frame.get("Peer-Address"))
    except (zmq.ZMQError, KeyError, UnicodeDecodeError):
        return "?"
