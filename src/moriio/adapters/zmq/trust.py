"""Allow-list of hosts a control channel may dial.

Peer addresses reach the control plane from untrusted places (request ids, client-supplied
transfer parameters). A channel dials a host only if it was configured as trusted, is the
channel's own host, or was learned through a handshake (:meth:`TrustList.add`).
Hosts compare exactly after trimming and lower-casing: ``localhost`` and ``127.0.0.1`` are
different entries.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from moriio.ports import PeerAddress, UntrustedPeerError


def normalize_host(host: str) -> str:
    """The canonical spelling of ``host``; raises ValueError for an empty or non-text host."""
    if not isinstance(host, str):
        raise TypeError(f"host must be a str, got {type(host).__name__}")
    canonical = host.strip().lower()
    if not canonical:
        raise ValueError("host must be a non-empty string")
    return canonical


class TrustList:
    """Thread-safe set of trusted hosts."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self._hosts = {normalize_host(host) for host in hosts}
        self._lock = threading.Lock()

    def add(self, host: str) -> None:
        """Trust ``host`` from now on."""
        canonical = normalize_host(host)
        with self._lock:
            self._hosts.add(canonical)

    def __contains__(self, host: object) -> bool:
        if not isinstance(host, str):
            return False
        with self._lock:
            return host.strip().lower() in self._hosts

    def snapshot(self) -> frozenset[str]:
        """The trusted hosts now."""
        with self._lock:
            return frozenset(self._hosts)

    def check(self, peer: PeerAddress) -> None:
        """Raise :class:`UntrustedPeerError` unless ``peer``'s host is trusted.

        Also rejects ports outside 1..65535 with ValueError.
        """
        if not isinstance(peer, PeerAddress):
            raise TypeError(f"peer must be a PeerAddress, got {type(peer).__name__}")
        if peer.host not in self:
            raise UntrustedPeerError(
                f"refusing to dial untrusted host {peer.host!r} (peer {peer}): it was neither "
                "learned through a handshake nor listed in trusted_remote_hosts"
            )
        if isinstance(peer.port, bool) or not isinstance(peer.port, int):
            raise ValueError(f"peer port must be an int, got {peer.port!r}")
        if not 0 < peer.port < 65536:
            raise ValueError(f"peer port must be in 1..65535, got {peer.port} for {peer}")
