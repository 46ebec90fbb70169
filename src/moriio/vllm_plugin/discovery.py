"""Registration with a P/D router's ping port (vLLM MoRIIO toy proxy protocol).

When ``proxy_ip`` and ``proxy_ping_port`` are set, the engine announces itself every
``proxy_ping_interval`` seconds with the same msgpack map as vLLM's in-tree MoRIIO connector
(:class:`moriio.domain.protocol.announcement.Announcement`), so the toy proxy (and ``moriio
router``) route to it with no extra step.

Only the engine of global DP rank 0 announces (the one behind the HTTP server ``vllm serve``
starts; headless DP nodes run none), with the engine's DP and TP sizes, as vLLM's in-tree
connector does. The sender is a process of its own (:mod:`moriio.vllm_plugin.beat`), so it
keeps beating while the engine's interpreter is held in a long native call (vllm-router drops
an instance after 5 s of silence); a send that cannot complete within a second is dropped
and retried at the next beat (the router may start after the engine). Sends never raise
into vLLM.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
import sys
import threading
from pathlib import Path

import msgpack

import moriio
from moriio.config.settings import ConnectorSettings
from moriio.domain.protocol.announcement import Announcement
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.log import get_logger

log = get_logger("moriio.discovery")


class RouterHeartbeat:
    """Sends the announcement to ``endpoint`` from a process of its own until stopped.

    The process (:mod:`moriio.vllm_plugin.beat`) stops when :meth:`stop` closes its input
    or when this process dies; a thread here only counts its beats.
    """

    def __init__(self, endpoint: str, announcement: Announcement, interval: float) -> None:
        self.endpoint = endpoint
        self.sent = 0
        self.dropped = 0
        payload = msgpack.packb(announcement.payload())
        env = dict(os.environ)
        root = str(Path(moriio.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "moriio.vllm_plugin.beat",
                endpoint,
                repr(interval),
                payload.hex(),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._reader = threading.Thread(target=self._count, name="moriio-heartbeat", daemon=True)
        self._reader.start()
        log.info("announcing to router", endpoint=endpoint, pid=self._process.pid)

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    @property
    def pid(self) -> int:
        """The heartbeat process's id."""
        return self._process.pid

    def stop(self, timeout: float = 2.0) -> None:
        if self._process.stdin is not None and not self._process.stdin.closed:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout)
        self._reader.join(timeout)

    def _count(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith(b"s"):
                self.sent += 1
                continue
            self.dropped += 1
            if self.dropped in (1, 10) or self.dropped % 100 == 0:
                log.warning("router announcement not sent", endpoint=self.endpoint)


def start_heartbeat(
    settings: ConnectorSettings, endpoint: LocalEndpoint, is_producer: bool
) -> RouterHeartbeat | None:
    """Announce this engine to the configured router; None when no router is configured or
    this engine is not global DP rank 0."""
    if settings.proxy_ip is None or settings.proxy_ping_port is None:
        return None
    warning = trust_warning(settings, endpoint.host)
    if warning is not None:
        log.warning(warning)
    if endpoint.dp_rank != 0:
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


def trust_warning(settings: ConnectorSettings, own_host: str) -> str | None:
    """Why peers behind the configured router would all be refused (None: some may not be).

    With no ``trusted_remote_hosts`` only this host is dialled: a router on another host
    almost surely pairs this engine with engines on other hosts.
    """
    if settings.proxy_ip is None or settings.trust_any_host or settings.trusted_remote_hosts:
        return None
    if settings.proxy_ip == own_host or _is_loopback(settings.proxy_ip):
        return None
    return (
        f"a router at {settings.proxy_ip} is configured but trusted_remote_hosts is empty: "
        f"only this host ({own_host}) may be dialled, so transfers with engines on any other "
        "host will be refused. Set trusted_remote_hosts to their addresses, CIDR ranges or "
        "host names (or '*')"
    )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
