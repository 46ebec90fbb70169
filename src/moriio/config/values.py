"""Parsers of single ``kv_connector_extra_config`` values; every error names the key.

Values arrive from JSON on the command line, so numbers may come as strings (``"6301"``,
``"0"``) and booleans as ``"true"``/``"1"``. Each parser takes the whole mapping and a key
and returns the key's value, or the default when the key is absent.
"""

from __future__ import annotations

import enum
import ipaddress
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from moriio.domain.values.hosts import InvalidHostError, canonical_host, parse_entry

E = TypeVar("E", bound=enum.Enum)

MIN_SECRET_BYTES = 16  # as the control channel requires
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class SettingsError(ValueError):
    """A ``kv_connector_extra_config`` is invalid; the message names the key."""


class InvalidValueError(SettingsError):
    """One key's value is invalid whatever the other keys say."""


def boolean(extra: Mapping[str, Any], key: str, default: bool) -> bool:
    value = extra.get(key, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidValueError(f"{key} must be a boolean (true/false), got {value!r}")


def choice(extra: Mapping[str, Any], key: str, kind: type[E], default: E) -> E:
    value = extra.get(key)
    if value is None:
        return default
    try:
        return kind(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(str(m.value) for m in kind)
        raise InvalidValueError(f"{key} must be one of {allowed}, got {value!r}") from None


def integer(extra: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = extra.get(key, default)
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise InvalidValueError(f"{key} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not low <= number <= high:
        raise InvalidValueError(f"{key} must be an integer in [{low}, {high}], got {value!r}")
    return number


def optional_int(extra: Mapping[str, Any], key: str) -> int | None:
    if extra.get(key) is None:
        return None
    return integer(extra, key, 0, 0, 2**63 - 1)


def optional_port(extra: Mapping[str, Any], key: str) -> int | None:
    """A port, or None when absent, empty or 0 (the in-tree connector's "unset")."""
    if extra.get(key) in (None, "", 0, "0"):
        return None
    return integer(extra, key, 0, 1, 65535)


def seconds(
    extra: Mapping[str, Any],
    key: str,
    default: float,
    *,
    zero: bool = False,
    high: float = math.inf,
) -> float:
    """Finite seconds in (0, high], or [0, high] with ``zero``; ``"0.5"`` is accepted."""
    value = extra.get(key, default)
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise InvalidValueError(f"{key} must be a number of seconds, got {value!r}") from None
    low_ok = number >= 0 if zero else number > 0
    if isinstance(value, bool) or not math.isfinite(number) or not low_ok:
        kind = "a non-negative" if zero else "a positive"
        raise InvalidValueError(f"{key} must be {kind}, finite number of seconds, got {value!r}")
    if number > high:
        raise InvalidValueError(f"{key} must be at most {high:g} s, got {value!r}")
    return number


def optional_str(extra: Mapping[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidValueError(f"{key} must be a string, got {value!r}")
    return value.strip()


def optional_host(extra: Mapping[str, Any], key: str) -> str | None:
    """An IP literal or host name in canonical spelling (no port, no whitespace)."""
    value = extra.get(key)
    if value is None or value == "":
        return None
    try:
        return canonical_host(value)
    except InvalidHostError as exc:
        raise InvalidValueError(
            f"{key} is not a valid host (an IP address or name): {exc}"
        ) from None


def advertised_host(extra: Mapping[str, Any], key: str) -> str | None:
    """:func:`optional_host`, and one peers can dial (not ``0.0.0.0``/``::``)."""
    host = optional_host(extra, key)
    if host is not None and _is_unspecified(host):
        raise InvalidValueError(
            f"{key} is the address peers dial, and {host!r} is none: give this host's address "
            "(listen_host chooses the interfaces listened on)"
        )
    return host


def listen_host(extra: Mapping[str, Any], key: str) -> str | None:
    """``"*"`` (all interfaces) or one IP address; None when absent."""
    value = extra.get(key)
    if value is None or value == "*":
        return value
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise InvalidValueError(
            f"{key} must be '*' (all interfaces) or an IP address, got {value!r:.80}"
        ) from None


def trusted_hosts(extra: Mapping[str, Any], key: str) -> tuple[tuple[str, ...], bool]:
    """A comma-separated string or a list of IPs, CIDR ranges and host names; ``"*"`` trusts
    any host. Every entry is checked as the trust list will read it."""
    value = extra.get(key)
    if value is None or value == "":
        return (), False
    if isinstance(value, str):
        items = [h.strip() for h in value.split(",")]
    elif isinstance(value, list | tuple):
        if not all(isinstance(h, str) for h in value):
            raise InvalidValueError(f"{key} must be a list of host strings, got {value!r:.80}")
        items = [h.strip() for h in value]
    else:
        raise InvalidValueError(f"{key} must be a comma-separated string or a list, got {value!r}")
    hosts: list[str] = []
    for item in items:
        if not item:
            raise InvalidValueError(f"{key} has an empty entry in {value!r:.80}")
        if item == "*":
            continue
        try:
            hosts.append(str(parse_entry(item)))
        except InvalidHostError as exc:
            raise InvalidValueError(
                f"{key}: {exc} (entries are IP addresses, CIDR ranges or host names)"
            ) from None
    return tuple(dict.fromkeys(hosts)), "*" in items


def readable_file(extra: Mapping[str, Any], key: str) -> str | None:
    """A path to a readable file holding a secret of at least 16 bytes (not whitespace)."""
    path = optional_str(extra, key)
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            data = file.read(1 << 20).strip()
    except OSError as exc:
        raise InvalidValueError(f"{key} {path!r} cannot be read: {exc.strerror or exc}") from None
    if len(data) < MIN_SECRET_BYTES:
        raise InvalidValueError(
            f"{key} {path!r} must hold a secret of at least {MIN_SECRET_BYTES} bytes, "
            f"got {len(data)}"
        )
    return path


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
