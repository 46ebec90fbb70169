"""Small output helpers for the ``moriio`` command: aligned tables, JSON, sizes, stdout."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

Row = Sequence[object]


def _plain(value: object) -> Any:
    """JSON-safe copy: numpy scalars/arrays become Python values, NaN/inf become null."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return _plain(tolist())
    return str(value)


def to_json(value: object, *, indent: int | None = None) -> str:
    """``value`` as JSON text (numpy values converted, non-finite floats as ``null``)."""
    return json.dumps(_plain(value), indent=indent, allow_nan=False)


def format_table(headers: Row, rows: Sequence[Row], *, right: Sequence[int] = ()) -> str:
    """A plain-text table; columns listed in ``right`` are right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def fmt_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 KiB'``; exact byte counts below 1 KiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.4g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_num(value: object, spec: str = ".3g", suffix: str = "") -> str:
    """A number formatted with ``spec`` and ``suffix``; ``n/a`` for ``None``."""
    if value is None:
        return "n/a"
    if isinstance(value, int | float):
        return f"{value:{spec}}{suffix}"
    return str(value)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout (file descriptor 1 too) to stderr meanwhile.

    Keeps ``--json`` output clean of libraries that log to stdout (NIXL, vLLM), including
    child processes started inside the block.
    """
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no file descriptor 1
        saved = -1
    try:
        if saved >= 0:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)
