"""The router's ping port: announcements arrive as msgpack maps on a ZMQ ROUTER socket.

Each one is validated (:class:`moriio.domain.protocol.announcement.Announcement`); a bad one is
counted and logged, never fatal.
"""

from __future__ import annotations

import threading

import msgpack
import zmq

from moriio.log import get_logger
from moriio.router.registry import Registry, parse_announcement

log = get_logger("moriio.router")

MAX_ANNOUNCEMENT_BYTES = 4096


class PingListener:
    """Receives announcements on a ZMQ ROUTER socket in a daemon thread."""

    def __init__(self, registry: Registry, host: str, port: int) -> None:
        self._registry = registry
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_ANNOUNCEMENT_BYTES)
        self._socket.bind(f"tcp://{host}:{port}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moriio-router-ping", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._socket.close()
        self._context.term()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._socket.poll(100):
                continue
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
                self.handle(frames[-1])
            except zmq.ZMQError as exc:
                log.warning("ping port receive failed", error=str(exc))

    def handle(self, raw: bytes) -> None:
        """Validate and record one announcement (never raises)."""
        try:
            instance = parse_announcement(msgpack.unpackb(raw, raw=False))
        except (ValueError, TypeError) as exc:  # AnnouncementError and msgpack's errors
            self._registry.rejected += 1
            log.warning("refused announcement", reason=str(exc))
            return
        if instance is not None:
            self._registry.add(instance)
