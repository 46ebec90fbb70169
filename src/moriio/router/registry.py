"""The router's registry of engines, kept from their announcements; one transfer mode for all.

What an announcement holds and how it is validated: :mod:`moriio.domain.protocol.announcement`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moriio.domain.protocol.announcement import Announcement, http_address
from moriio.domain.values.addresses import ControlAddress
from moriio.log import get_logger

log = get_logger("moriio.router")

DEFAULT_STALE_AFTER_S = 10.0  # over three of the in-tree connector's 3 s ping intervals


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

    @classmethod
    def announced(cls, announcement: Announcement) -> Instance:
        """The engine ``announcement`` describes, as the router routes to it."""
        return cls(
            role="P" if announcement.is_producer else "D",
            http_host=announcement.http_host,
            http_port=announcement.http_port,
            host=announcement.host,
            handshake_port=announcement.handshake_port,
            notify_port=announcement.notify_port,
            dp_size=announcement.dp_size,
            tp_size=announcement.tp_size,
            transfer_mode=announcement.mode.name,
        )

    @property
    def url(self) -> str:
        return f"http://{http_address(self.http_host, self.http_port)}"

    @property
    def control(self) -> ControlAddress:
        return ControlAddress(self.host, self.handshake_port, self.notify_port)

    @property
    def zmq_address(self) -> str:
        return self.control.format()


def parse_announcement(data: object) -> Instance | None:
    """The instance ``data`` announces; None for a HELLO; raises AnnouncementError."""
    announcement = Announcement.from_payload(data)
    return None if announcement is None else Instance.announced(announcement)


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
