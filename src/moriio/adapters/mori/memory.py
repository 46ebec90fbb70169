"""Checks on host memory before mori registers it.

mori's RDMA backend registers a region with the NIC lazily, at the first session, and calls
``abort()`` when ``ibv_reg_mr`` fails, so a bad host range must be refused before that.
"""

from __future__ import annotations

from pathlib import Path

_MAPS = Path("/proc/self/maps")


def _writable_ranges(maps: str) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=2)
        if len(fields) < 2 or not fields[1].startswith("rw"):
            continue
        start, _, end = fields[0].partition("-")
        ranges.append((int(start, 16), int(end, 16)))
    ranges.sort()
    return ranges


def unmapped_gap(addr: int, length: int, maps: str | None = None) -> int | None:
    """First address of ``[addr, addr + length)`` that is not mapped read-write; None if all is.

    ``maps`` is the text of ``/proc/self/maps``; when it cannot be read nothing is refused.
    """
    if maps is None:
        try:
            maps = _MAPS.read_text()
        except OSError:
            return None
    cursor, end = addr, addr + length
    for start, stop in _writable_ranges(maps):
        if stop <= cursor:
            continue
        if start > cursor:
            return cursor
        cursor = stop
        if cursor >= end:
            return None
    return cursor if cursor < end else None
