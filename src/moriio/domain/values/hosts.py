"""Host names and addresses as they enter from untrusted places, validated once.

One function decides what a host is, and returns the spelling that is both checked against
allow-lists and dialled, so the two can never disagree (no silent trimming on one side).
"""

from __future__ import annotations

import ipaddress
import re

MAX_HOST_LEN = 253  # a DNS name; IP literals are shorter
MAX_PORT = 65535

_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class InvalidHostError(ValueError):
    """Not a usable host: the message says why."""


_KNOWN_LIMIT = 4096  # distinct valid spellings remembered (the table is emptied when full)
_known: dict[str, str] = {}  # spelling -> canonical host: every message names its sender


def canonical_host(host: object) -> str:
    """``host`` as an IPv4/IPv6 literal or an RFC 1123 host name, lower-cased.

    Rejects non-text, empty or over-long values, whitespace and control characters
    (nothing is trimmed), brackets, and names whose labels are not letters, digits and
    inner hyphens. IP literals come back in their compressed form (``::1``). A spelling
    seen before is answered from a bounded table (only valid ones are kept).
    """
    if type(host) is not str:
        return _canonical(host)
    known = _known.get(host)
    if known is None:
        known = _canonical(host)
        if len(_known) >= _KNOWN_LIMIT:
            _known.clear()
        _known[host] = known
    return known


def _canonical(host: object) -> str:
    if not isinstance(host, str):
        raise InvalidHostError(f"host must be a str, got {type(host).__name__}")
    if not host or len(host) > MAX_HOST_LEN:
        raise InvalidHostError(f"host must have 1..{MAX_HOST_LEN} characters, got {len(host)}")
    if not host.isascii() or not host.isprintable() or any(c.isspace() for c in host):
        raise InvalidHostError(f"host {host!r:.80} holds whitespace or non-ASCII characters")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    name = host.lower().removesuffix(".")
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        raise InvalidHostError(f"host {host!r:.80} is neither an IP address nor a host name")
    return name


def parse_entry(entry: str) -> str | Network:
    """A trust-list entry: a CIDR range, or a host in canonical spelling (else
    :class:`InvalidHostError`). The connector's settings and its trust list both use it."""
    if "/" in entry:
        try:
            return ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise InvalidHostError(f"{entry!r:.80} is not a CIDR range") from None
    return canonical_host(entry)


def check_port(port: object, what: str = "port") -> int:
    """``port`` as an int in 1..65535 (a bool is not a port)."""
    if type(port) is not int or not 0 < port <= MAX_PORT:
        raise InvalidHostError(f"{what} must be an int in 1..{MAX_PORT}, got {port!r:.40}")
    return port
