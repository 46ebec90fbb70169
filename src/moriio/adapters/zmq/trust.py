"""Allow-list of hosts a control channel may dial.

Peer addresses reach the control plane from untrusted places (request ids, client-supplied
transfer parameters). A channel dials a host only if it was configured as trusted, is the
channel's own host, or was learned through a handshake (:meth:`TrustList.add`); ``"*"``
(``trust_any``) lifts the restriction. Hosts are validated and compared in the one canonical
spelling of :func:`moriio.domain.wire.hosts.canonical_host`, the same one that is dialled:
``localhost`` and ``127.0.0.1`` are different entries, and ``"127.0.0.1 "`` is no host.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from moriio.domain.wire.hosts import InvalidHostError, canonical_host, check_port
from moriio.ports import ControlChannelError, PeerAddress, UntrustedPeerError


class InvalidPeerError(ControlChannelError):
    """A peer address that is not a valid host and port; nothing was dialled."""


def normalize_host(host: str) -> str:
    """The canonical spelling of ``host``; raises ValueError for anything that is no host."""
    return canonical_host(host)


class TrustList:
    """Thread-safe set of trusted hosts."""

    def __init__(self, hosts: Iterable[str], *, trust_any: bool = False) -> None:
        self._hosts = {canonical_host(host) for host in hosts}
        self._trust_any = trust_any
        self._lock = threading.Lock()

    @property
    def trust_any(self) -> bool:
        return self._trust_any

    def add(self, host: str) -> None:
        """Trust ``host`` from now on."""
        canonical = canonical_host(host)
        with self._lock:
            self._hosts.add(canonical)

    def __contains__(self, host: object) -> bool:
        try:
            canonical = canonical_host(host)
        except InvalidHostError:
            return False
        with self._lock:
            return self._trust_any or canonical in self._hosts

    def snapshot(self) -> frozenset[str]:
        """The trusted hosts now (``"*"`` included when any host is trusted)."""
        with self._lock:
            return frozenset(self._hosts | ({"*"} if self._trust_any else set()))

    def check(self, peer: PeerAddress) -> PeerAddress:
        """``peer`` in canonical form, if it may be dialled.

        Raises :class:`InvalidPeerError` for a malformed host or port and
        :class:`UntrustedPeerError` for a host that is not trusted.
        """
        if not isinstance(peer, PeerAddress):
            raise InvalidPeerError(f"peer must be a PeerAddress, got {type(peer).__name__}")
        try:
            host = canonical_host(peer.host)
            port = check_port(peer.port, "peer port")
        except InvalidHostError as exc:
            raise InvalidPeerError(f"refusing to dial {peer.host!r:.80}: {exc}") from None
        if host not in self:
            raise UntrustedPeerError(
                f"refusing to dial untrusted host {host!r} (peer {peer}): it was neither "
                "learned through a handshake nor listed in trusted_remote_hosts"
            )
        return peer if host == peer.host else PeerAddress(host, port)
