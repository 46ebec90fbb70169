"""Host-name resolution for the trust list: bounded, cached, re-resolved.

In Kubernetes a peer's address changes with every pod restart while its DNS name stays; a
trust entry naming the peer must follow it. Answers (and failures) are kept for a while, so
a dial never waits on DNS more than once per name and period, and the table is emptied when
it grows past its bound.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from moriio.domain.values.hosts import InvalidHostError, canonical_host

Resolve = Callable[[str], tuple[str, ...]]  # host name -> its addresses (canonical IPs)

DEFAULT_TTL_S = 30.0  # llm-d re-resolves its peers every 30 s too
DEFAULT_NEGATIVE_TTL_S = 5.0  # a name that did not resolve is asked again after this
DEFAULT_MAX_NAMES = 1024


def system_resolve(name: str) -> tuple[str, ...]:
    """Every address the system resolver gives ``name`` (empty when it gives none)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return ()
    addresses: dict[str, None] = {}
    for info in infos:
        try:
            addresses[canonical_host(str(info[4][0]).split("%", 1)[0])] = None
        except InvalidHostError:
            continue
    return tuple(addresses)


class CachedResolver:
    """``resolve`` with a bounded cache: answers for ``ttl`` s, failures for ``negative_ttl``."""

    def __init__(
        self,
        resolve: Resolve = system_resolve,
        *,
        ttl: float = DEFAULT_TTL_S,
        negative_ttl: float = DEFAULT_NEGATIVE_TTL_S,
        max_names: int = DEFAULT_MAX_NAMES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (ttl > 0 and negative_ttl > 0 and max_names > 0):
            raise ValueError("ttl, negative_ttl and max_names must be positive")
        self._resolve = resolve
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._max_names = max_names
        self._clock = clock
        self._lock = threading.Lock()
        self._answers: dict[str, tuple[float, tuple[str, ...]]] = {}
        self.lookups = 0  # questions actually asked of ``resolve``

    def __call__(self, name: str) -> tuple[str, ...]:
        now = self._clock()
        with self._lock:
            cached = self._answers.get(name)
        if cached is not None and cached[0] > now:
            return cached[1]
        addresses = self._resolve(name)
        expires = now + (self._ttl if addresses else self._negative_ttl)
        with self._lock:
            self.lookups += 1
            if name not in self._answers and len(self._answers) >= self._max_names:
                self._answers.clear()
            self._answers[name] = (expires, addresses)
        return addresses
