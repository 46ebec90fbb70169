"""Registration with a P/D router's ping port (vLLM MoRIIO toy proxy protocol).

When ``proxy_ip`` and ``proxy_ping_port`` are set, the engine announces itself every
``proxy_ping_interval`` seconds with the same msgpack payload as vLLM's in-tree MoRIIO
connector, so the toy proxy (and ``moriio router``) route to it with no extra step::

    {"type": "P" | "D", "http_address": "HOST:HTTP_PORT",
     "zmq_address": "host:HOST,handshake:PORT,notify:PORT",
     "dp_size": N, "tp_size": N, "transfer_mode": "READ" | "WRITE"}

The sender is a daemon thread in the scheduler's process with its own ZMQ context; a send
that cannot complete within a second is dropped and retried at the next beat (the router
may start after the engine). Sends never raise into vLLM.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from moriio.config.settings import ConnectorSettings
from moriio.domain.scheduler.producer_book import LocalEndpoint
from moriio.domain.wire.modes import TransferMode
from moriio.log import get_logger

log = get_logger("moriio.discovery")

SEND_TIMEOUT_MS = 1000


@dataclass(frozen=True, slots=True)
class Announcement:
    is_producer: bool
    http_host: str
    http_port: int
    host: str
    handshake_port: int
    notify_port: int
    dp_size: int
    tp_size: int
    mode: TransferMode

    def payload(self) -> dict[str, Any]:
        """The toy proxy's registration map, key for key."""
        return {
            "type": "P" if self.is_producer else "D",
            "http_address": f"{self.http_host}:{self.http_port}",
            "zmq_address": (
                f"host:{self.host},handshake:{self.handshake_port},notify:{self.notify_port}"
            ),
            "dp_size": self.dp_size,
            "tp_size": self.tp_size,
            "transfer_mode": self.mode.name,
        }


class RouterHeartbeat:
    """Sends the announcement to ``tcp://proxy_ip:proxy_ping_port`` until stopped."""

    def __init__(self, endpoint: str, announcement: Announcement, interval: float) -> None:
        self.endpoint = endpoint
        self._payload = msgpack.packb(announcement.payload())
        self._interval = interval
        self._stop = threading.Event()
        self.sent = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="moriio-heartbeat", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        try:
            sock.connect(self.endpoint)
            log.info("announcing to router", endpoint=self.endpoint)
            while True:
                try:
                    sock.send(self._payload)
                    self.sent += 1
                except zmq.ZMQError as exc:
                    self.dropped += 1
                    if self.dropped in (1, 10) or self.dropped % 100 == 0:
                        log.warning(
                            "router announcement not sent", endpoint=self.endpoint, error=str(exc)
                        )
                if self._stop.wait(self._interval):
                    return
        except zmq.ZMQError as exc:
            log.error("router heartbeat stopped", endpoint=self.endpoint, error=str(exc))
        finally:
            sock.close()
            context.term()


def start_heartbeat(
    settings: ConnectorSettings, endpoint: LocalEndpoint, is_producer: bool
) -> RouterHeartbeat | None:
    """Announce this engine to the configured router; None when no router is configured."""
    if settings.proxy_ip is None or settings.proxy_ping_port is None:
        return None
    assert settings.http_port is not None  # parse_settings requires it with proxy_ip
    announcement = Announcement(
        is_producer=is_producer,
        http_host=endpoint.host,
        http_port=settings.http_port,
        host=endpoint.host,
        handshake_port=endpoint.handshake_port,
        notify_port=endpoint.notify_port,
        dp_size=endpoint.dp_size,
        tp_size=endpoint.tp_size,
        mode=settings.mode,
    )
    proxy = f"[{settings.proxy_ip}]" if ":" in settings.proxy_ip else settings.proxy_ip
    return RouterHeartbeat(
        f"tcp://{proxy}:{settings.proxy_ping_port}", announcement, settings.proxy_ping_interval
    )
