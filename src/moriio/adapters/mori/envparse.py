"""mori's parsing of its ``MORI_IO_*`` variables, so the adapter reasons on what mori applies.

mori reads each override with ``env::Override`` (``include/mori/io/env.hpp``): an unset or
empty variable keeps the configured value, and a value its parser rejects is warned about and
ignored (the configured value stays). The parsers are ``mori/utils/env_utils.hpp``'s:
``ParsePositiveInt`` (``strtol`` over the whole text, 0 and negatives rejected), ``ParseBool``
(1/0, true/false, on/off, yes/no, any case), plus the RDMA backend's own for
``MORI_IO_POST_BATCH_SIZE`` (-1 or positive) and ``MORI_IO_POLL_CQ_MODE`` (0/polling,
1/event). Pure functions of the text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")
INT_MAX = 2**31 - 1
U32_MAX = 2**32 - 1


def strtol(raw: str) -> int | None:
    """``strtol(raw, &end, 10)`` that consumed all of ``raw``: leading blanks and a sign."""
    text = raw.lstrip(" \t\n\r\f\v")
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    return int(text)


def positive_int(raw: str) -> int | None:
    value = strtol(raw)
    return value if value is not None and 0 < value <= INT_MAX else None


def positive_u32(raw: str) -> int | None:
    value = strtol(raw)
    return value if value is not None and 0 < value <= U32_MAX else None


def any_int(raw: str) -> int | None:
    value = strtol(raw)
    return value if value is not None and -INT_MAX - 1 <= value <= INT_MAX else None


def boolean(raw: str) -> bool | None:
    lowered = raw.lower()
    if raw == "1" or lowered in ("true", "on", "yes"):
        return True
    if raw == "0" or lowered in ("false", "off", "no"):
        return False
    return None


def post_batch_size(raw: str) -> int | None:
    return -1 if raw == "-1" else positive_int(raw)


def event_poll_mode(raw: str) -> bool | None:
    """``MORI_IO_POLL_CQ_MODE``: True for EVENT, False for POLLING."""
    if raw == "0" or raw.lower() == "polling":
        return False
    if raw == "1" or raw.lower() == "event":
        return True
    return None


def override(
    environ: Mapping[str, str], name: str, parse: Callable[[str], T | None]
) -> tuple[T | None, str | None]:
    """(the value mori applies from ``name``, or None to keep the configured one; the raw
    text mori ignores as invalid, or None)."""
    raw = environ.get(name)
    if not raw:
        return None, None
    value = parse(raw)
    return (None, raw) if value is None else (value, None)
