"""Allow-list of hosts a control channel may dial.

Peer addresses reach the control plane from untrusted places (request ids, client-supplied
transfer parameters). A channel dials a host only if it was configured as trusted, is the
channel's own host, or was learned through a handshake (:meth:`TrustList.add`); ``"*"``
(``trust_any``) lifts the restriction. Hosts are validated and compared in the one canonical
spelling of :func:`moriio.domain.values.hosts.canonical_host`, the same one that is dialled:
``"127.0.0.1 "`` is no host.

Entries may also be CIDR ranges (``10.0.0.0/8``: every address in it) and host names, which
trust the name itself and every address it resolves to (re-resolved as it changes, see
:mod:`moriio.adapters.zmq.resolve`). A peer named by a host name that is not itself listed is
trusted when every address it resolves to is, and is then dialled at the checked address,
so nothing is ever dialled that was not checked first.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable

from moriio.adapters.zmq.resolve import CachedResolver, Resolve
from moriio.domain.values.hosts import (
    InvalidHostError,
    Network,
    canonical_host,
    check_port,
    parse_entry,
)
from moriio.ports import ControlChannelError, PeerAddress, UntrustedPeerError


class InvalidPeerError(ControlChannelError):
    """A peer address that is not a valid host and port; nothing was dialled."""


def normalize_host(host: str) -> str:
    """The canonical spelling of ``host``; raises ValueError for anything that is no host."""
    return canonical_host(host)


def is_wildcard(host: str) -> bool:
    """Whether ``host`` is an all-interfaces address (``0.0.0.0``, ``::``): never a peer."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class TrustList:
    """Thread-safe set of trusted hosts, ranges and names.

    ``resolve``: host name -> addresses (default: the system resolver behind a bounded cache).
    """

    def __init__(
        self, hosts: Iterable[str], *, trust_any: bool = False, resolve: Resolve | None = None
    ) -> None:
        self._hosts: set[str] = set()
        self._networks: list[Network] = []
        for entry in hosts:
            parsed = parse_entry(entry)
            if isinstance(parsed, str):
                self._hosts.add(parsed)
            else:
                self._networks.append(parsed)
        # Configured names: their addresses are trusted as long as they resolve to them.
        self._names = tuple(sorted(h for h in self._hosts if _ip(h) is None))
        self._resolve = resolve if resolve is not None else CachedResolver()
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
            return self._dial_host(canonical_host(host)) is not None
        except InvalidHostError:
            return False

    def _dial_host(self, host: str) -> str | None:
        """The address to dial for canonical ``host``; None when it is not trusted."""
        with self._lock:
            if self._trust_any or host in self._hosts:
                return host
        if _ip(host) is not None:
            return host if self._address_trusted(host) else None
        if not (self._networks or self._names):
            return None
        addresses = self._resolve(host)
        if addresses and all(self._address_trusted(a) for a in addresses):
            return addresses[0]
        return None

    def _address_trusted(self, address: str) -> bool:
        ip = _ip(address)
        with self._lock:
            if address in self._hosts:
                return True
        if ip is not None and any(ip in network for network in self._networks):
            return True
        return any(address in self._resolve(name) for name in self._names)

    def snapshot(self) -> frozenset[str]:
        """The trusted entries now (``"*"`` included when any host is trusted)."""
        with self._lock:
            hosts = self._hosts | {str(n) for n in self._networks}
            return frozenset(hosts | ({"*"} if self._trust_any else set()))

    def check(self, peer: PeerAddress) -> PeerAddress:
        """``peer`` in canonical form (at its checked address), if it may be dialled.

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
        dial = self._dial_host(host)
        if dial is None:
            raise UntrustedPeerError(
                f"refusing to dial untrusted host {host!r} (peer {peer}): it was neither "
                "learned through a handshake nor listed in trusted_remote_hosts"
            )
        return peer if dial == peer.host else PeerAddress(dial, port)
