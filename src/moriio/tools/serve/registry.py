"""The router's instance registry: engines announce themselves on a ZMQ ping port.

Speaks the registration protocol of vLLM's MoRIIO toy proxy. An engine's connector connects
a DEALER to the router's ROUTER socket and sends, every few seconds, one msgpack map::

    {"type": "P" | "D", "http_address": "HOST:PORT",
     "zmq_address": "host:IP,handshake:PORT,notify:PORT",
     "dp_size": N, "tp_size": N, "transfer_mode": "READ" | "WRITE"}

``{"type": "HELLO"}`` is ignored. The older form ``{"type": "register", "role": "P" | "D",
"request_address": "http://HOST:PORT/v1/completions", "handshake_port": N,
"notify_port": N, ...}`` is accepted too. Every instance must use the same transfer mode.
Each announcement is validated; a bad one is counted and logged, never fatal.
"""

from __future__ import annotations

import ipaddress
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

from moriio.log import get_logger

log = get_logger("moriio.router")

MAX_ANNOUNCEMENT_BYTES = 4096
DEFAULT_STALE_AFTER_S = 10.0  # over three of the in-tree connector's 3 s ping intervals
_MODES = frozenset({"READ", "WRITE"})
_HOST_PORT = re.compile(r"^(?:https?://)?([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})(/.*)?$")


class AnnouncementError(ValueError):
    """A registration message is malformed; the message names the field."""


@dataclass(frozen=True, slots=True)
class Instance:
    """One registered engine (its rank-0 connector addresses)."""

    role: str  # "P" or "D"
    http_host: str
    http_port: int
    host: str
    handshake_port: int
    notify_port: int
    dp_size: int
    tp_size: int
    transfer_mode: str

    @property
    def url(self) -> str:
        return f"http://{self.http_host}:{self.http_port}"

    @property
    def zmq_address(self) -> str:
        return f"host:{self.host},handshake:{self.handshake_port},notify:{self.notify_port}"


def parse_announcement(data: object) -> Instance | None:
    """The instance ``data`` announces; None for a HELLO; raises AnnouncementError."""
    if not isinstance(data, Mapping):
        raise AnnouncementError("announcement must be a map")
    kind = data.get("type")
    if kind == "HELLO":
        return None
    if kind in ("P", "D"):
        http_host, http_port = _host_port(data.get("http_address"), "http_address")
        host, handshake, notify = _zmq_address(data.get("zmq_address"))
        role = str(kind)
    elif kind == "register":
        role = str(data.get("role"))
        if role not in ("P", "D"):
            raise AnnouncementError(f"role must be 'P' or 'D', got {data.get('role')!r}")
        http_host, http_port = _host_port(data.get("request_address"), "request_address")
        host = http_host
        handshake = _port(data.get("handshake_port"), "handshake_port")
        notify = _port(data.get("notify_port"), "notify_port")
    else:
        raise AnnouncementError(f"type must be 'P', 'D', 'register' or 'HELLO', got {kind!r}")
    mode = data.get("transfer_mode")
    if mode not in _MODES:
        raise AnnouncementError(f"transfer_mode must be READ or WRITE, got {mode!r}")
    return Instance(
        role=role,
        http_host=http_host,
        http_port=http_port,
        host=host,
        handshake_port=handshake,
        notify_port=notify,
        dp_size=_size(data.get("dp_size", 1), "dp_size"),
        tp_size=_size(data.get("tp_size", 1), "tp_size"),
        transfer_mode=str(mode),
    )


def _host(text: str, what: str) -> str:
    if text.startswith("["):
        text = text[1:-1]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        if re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9\-.]{0,251}[A-Za-z0-9])?", text):
            return text
    raise AnnouncementError(f"{what} has an invalid host {text!r}")


def _host_port(value: object, what: str) -> tuple[str, int]:
    match = _HOST_PORT.match(value) if isinstance(value, str) else None
    if match is None:
        raise AnnouncementError(f"{what} must be 'HOST:PORT', got {value!r}")
    return _host(match.group(1), what), _port(int(match.group(2)), what)


def _zmq_address(value: object) -> tuple[str, int, int]:
    if not isinstance(value, str):
        raise AnnouncementError(f"zmq_address must be a string, got {value!r}")
    parts = {}
    for segment in value.split(","):
        key, _, val = segment.partition(":")
        parts[key.strip()] = val.strip()
    if not {"host", "handshake", "notify"} <= parts.keys():
        raise AnnouncementError(
            f"zmq_address must be 'host:IP,handshake:PORT,notify:PORT', got {value!r}"
        )
    return (
        _host(parts["host"], "zmq_address"),
        _port(parts["handshake"], "zmq_address handshake"),
        _port(parts["notify"], "zmq_address notify"),
    )


def _port(value: object, what: str) -> int:
    try:
        port = int(str(value)) if not isinstance(value, bool) else -1
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise AnnouncementError(f"{what} must be a port in [1, 65535], got {value!r}")
    return port


def _size(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise AnnouncementError(f"{what} must be an integer in [1, 1024], got {value!r}")
    return value


@dataclass
class Registry:
    """Registered prefill and decode instances, updated from the listener thread.

    An instance not heard from for ``stale_after_s`` seconds (a dead or unreachable engine;
    engines announce themselves every ``proxy_ping_interval``) is left out of the pools that
    requests are routed to, until it announces itself again.
    """

    prefill: list[Instance] = field(default_factory=list)
    decode: list[Instance] = field(default_factory=list)
    transfer_mode: str | None = None
    rejected: int = 0
    last_seen: dict[Instance, float] = field(default_factory=dict)
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not 0 < self.stale_after_s < float("inf"):
            raise ValueError(f"stale_after_s must be positive and finite, got {self.stale_after_s}")

    def add(self, instance: Instance) -> bool:
        """Record ``instance``; False (logged) when its transfer mode conflicts."""
        with self._lock:
            if self.transfer_mode is None:
                self.transfer_mode = instance.transfer_mode
            elif instance.transfer_mode != self.transfer_mode:
                self.rejected += 1
                log.error(
                    "refused an instance of another transfer mode",
                    role=instance.role,
                    peer=instance.url,
                    transfer_mode=instance.transfer_mode,
                    router_mode=self.transfer_mode,
                )
                return False
            self.last_seen[instance] = self.clock()
            pool = self.prefill if instance.role == "P" else self.decode
            if instance not in pool:
                pool.append(instance)
                log.info(
                    "registered instance", role=instance.role, peer=instance.url, instance=instance
                )
            return True

    def snapshot(self) -> tuple[list[Instance], list[Instance], str | None]:
        """The live prefill and decode instances, and the transfer mode."""
        with self._lock:
            return self._live(self.prefill), self._live(self.decode), self.transfer_mode

    def _live(self, pool: list[Instance]) -> list[Instance]:
        oldest = self.clock() - self.stale_after_s
        return [i for i in pool if self.last_seen[i] >= oldest]

    def to_json(self) -> dict[str, Any]:
        prefill, decode, mode = self.snapshot()
        live = {*prefill, *decode}
        with self._lock:
            stale = [i.url for i in (*self.prefill, *self.decode) if i not in live]
        return {
            "transfer_mode": mode,
            "prefill": [i.url for i in prefill],
            "decode": [i.url for i in decode],
            "stale": stale,
            "rejected": self.rejected,
        }


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
