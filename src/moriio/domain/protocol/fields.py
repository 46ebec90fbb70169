"""Strict readers for plain wire values: typed fields, limits, and stable rejection reasons."""

from __future__ import annotations

import enum

from moriio.domain.protocol.messages import MAX_HOST_LEN, MAX_STR_LEN
from moriio.domain.values.hosts import InvalidHostError, canonical_host
from moriio.ports import MalformedMessageError


class RejectReason(enum.StrEnum):
    """Stable codes for :attr:`MalformedMessageError.reason`, fit for counting."""

    NOT_A_MAPPING = "not_a_mapping"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_TYPE = "unknown_type"
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"
    BAD_TYPE = "bad_type"
    OUT_OF_RANGE = "out_of_range"
    INVALID_VALUE = "invalid_value"


def reject(reason: RejectReason, detail: str) -> MalformedMessageError:
    return MalformedMessageError(reason.value, detail)


def value_type(value: object) -> str:
    return type(value).__name__


class FieldReader:
    """Reads typed fields out of one wire mapping, remembering which were consumed."""

    __slots__ = ("_raw", "_seen", "_where")

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, dict):
            raise reject(RejectReason.BAD_TYPE, f"{where}: expected a map, got {value_type(raw)}")
        self._raw: dict[object, object] = raw
        self._where = where
        self._seen: set[str] = set()

    def _get(self, key: str) -> object:
        if key not in self._raw:
            raise reject(RejectReason.MISSING_FIELD, f"{self._where}.{key}")
        self._seen.add(key)
        return self._raw[key]

    def _bad_type(self, key: str, expected: str, value: object) -> MalformedMessageError:
        return reject(
            RejectReason.BAD_TYPE,
            f"{self._where}.{key}: expected {expected}, got {value_type(value)}",
        )

    def text(self, key: str, max_len: int = MAX_STR_LEN, allow_empty: bool = False) -> str:
        value = self._get(key)
        if type(value) is not str:
            raise self._bad_type(key, "str", value)
        if len(value) > max_len:
            raise reject(
                RejectReason.OUT_OF_RANGE, f"{self._where}.{key}: {len(value)} > {max_len} chars"
            )
        if not value and not allow_empty:
            raise reject(RejectReason.INVALID_VALUE, f"{self._where}.{key}: empty")
        return value

    def optional_text(self, key: str, max_len: int = MAX_STR_LEN) -> str:
        """A text field a peer may leave out (empty then); checked like :meth:`text`."""
        return self.text(key, max_len, allow_empty=True) if key in self._raw else ""

    def optional_integer(self, key: str, lo: int, hi: int, default: int) -> int:
        """An int in ``[lo, hi]`` a peer may leave out (``default`` then)."""
        return self.integer(key, lo, hi) if key in self._raw else default

    def integer(self, key: str, lo: int, hi: int) -> int:
        """An int in ``[lo, hi]``."""
        value = self._get(key)
        if type(value) is not int:
            raise self._bad_type(key, "int", value)
        if not lo <= value <= hi:
            raise reject(
                RejectReason.OUT_OF_RANGE, f"{self._where}.{key}: {value} not in [{lo}, {hi}]"
            )
        return value

    def number(self, key: str, lo: float, hi: float) -> float:
        """A finite float (or int) in ``[lo, hi]``."""
        value = self._get(key)
        if type(value) not in (float, int):
            raise self._bad_type(key, "float", value)
        number = float(value)  # type: ignore[arg-type]
        if not lo <= number <= hi:  # NaN fails too; infinities are out of range
            raise reject(
                RejectReason.OUT_OF_RANGE, f"{self._where}.{key}: {value!r} not in [{lo}, {hi}]"
            )
        return number

    def boolean(self, key: str) -> bool:
        value = self._get(key)
        if type(value) is not bool:
            raise self._bad_type(key, "bool", value)
        return value

    def blob(self, key: str, max_len: int) -> bytes:
        value = self._get(key)
        if type(value) is not bytes:
            raise self._bad_type(key, "bytes", value)
        if len(value) > max_len:
            raise reject(
                RejectReason.OUT_OF_RANGE, f"{self._where}.{key}: {len(value)} > {max_len} bytes"
            )
        return value

    def array(self, key: str, max_items: int) -> list[object] | tuple[object, ...]:
        value = self._get(key)
        if not isinstance(value, list | tuple):
            raise self._bad_type(key, "list", value)
        if len(value) > max_items:
            raise reject(
                RejectReason.OUT_OF_RANGE,
                f"{self._where}.{key}: {len(value)} > {max_items} items",
            )
        return value

    def int_array(self, key: str, max_items: int, lo: int, hi: int) -> tuple[int, ...]:
        items = self.array(key, max_items)
        if not items:
            return ()
        if set(map(type, items)) != {int}:
            raise self._bad_type(key, "list of int", next(x for x in items if type(x) is not int))
        ints: tuple[int, ...] = tuple(items)  # type: ignore[arg-type]
        if min(ints) < lo or max(ints) > hi:
            raise reject(
                RejectReason.OUT_OF_RANGE,
                f"{self._where}.{key}: values must lie in [{lo}, {hi}]",
            )
        return ints

    def text_array(self, key: str, max_items: int, max_len: int = MAX_STR_LEN) -> tuple[str, ...]:
        items = self.array(key, max_items)
        for item in items:
            if type(item) is not str:
                raise self._bad_type(key, "list of str", item)
            if not item or len(item) > max_len:
                raise reject(
                    RejectReason.OUT_OF_RANGE,
                    f"{self._where}.{key}: each entry needs 1..{max_len} chars",
                )
        return tuple(items)  # type: ignore[arg-type]

    def blob_array(self, key: str, max_items: int, max_len: int) -> tuple[bytes, ...]:
        items = self.array(key, max_items)
        for item in items:
            if type(item) is not bytes:
                raise self._bad_type(key, "list of bytes", item)
            if len(item) > max_len:
                raise reject(
                    RejectReason.OUT_OF_RANGE,
                    f"{self._where}.{key}: an entry has {len(item)} > {max_len} bytes",
                )
        return tuple(items)  # type: ignore[arg-type]

    def nested(self, key: str) -> FieldReader:
        return FieldReader(self._get(key), f"{self._where}.{key}")

    def mark_seen(self, *keys: str) -> None:
        """Count ``keys`` as consumed (envelope fields read elsewhere)."""
        self._seen.update(keys)

    def finish(self) -> None:
        """Reject fields that are not part of the message."""
        if len(self._seen) != len(self._raw):
            extra = sorted(repr(k)[:40] for k in self._raw if k not in self._seen)
            shown = ", ".join(extra[:5]) + (", ..." if len(extra) > 5 else "")
            raise reject(RejectReason.UNKNOWN_FIELD, f"{self._where}: {shown}")


def invalid(where: str, detail: str) -> MalformedMessageError:
    return reject(RejectReason.INVALID_VALUE, f"{where}: {detail}")


def host_field(f: FieldReader, key: str) -> str:
    """A host field: the canonical spelling, or rejected (never trimmed)."""
    raw = f.text(key, MAX_HOST_LEN)
    try:
        host = canonical_host(raw)
    except InvalidHostError as exc:
        raise invalid(key, str(exc)) from None
    if host != raw:
        raise invalid(key, f"host {raw!r:.80} is not in canonical form {host!r}")
    return host
