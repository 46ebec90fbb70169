"""The soak's text output: a table row per interval and engine, then slopes, kills, verdict."""

from __future__ import annotations

from collections.abc import Sequence

from moriio.output import format_table
from moriio_tools.soak.records import Interval, Kill, Slope
from moriio_tools.soak.runner import SoakResult
from moriio_tools.soak.verdict import (
    FDS_SLOPE_MAX_PER_H,
    HELD_BLOCKS_SLOPE_MAX_PER_H,
    RSS_SLOPE_MAX_MIB_PER_H,
    WARMUP_S,
)

# (header, width): the interval's figures, then one engine's at the quiet end.
COLUMNS = (
    ("#", 3),
    ("mode", 5),
    ("t_s", 6),
    ("sent", 5),
    ("answered", 8),
    ("equal", 5),
    ("errors", 6),
    ("kill_err", 8),
    ("cancelled", 9),
    ("quiet_s", 7),
    ("engine", 8),
    ("inc", 3),
    ("up_s", 5),
    ("held", 4),
    ("reqs", 4),
    ("rss_MiB", 8),
    ("fds", 5),
    ("procs", 5),
    ("handshakes", 10),
    ("failed", 6),
    ("teardowns", 9),
)
INTERVAL_COLUMNS = 10  # the first columns, printed on an interval's first engine row only


def _line(cells: Sequence[object]) -> str:
    return "  ".join(str(c).rjust(w) for c, (_, w) in zip(cells, COLUMNS, strict=True)).rstrip()


def header() -> str:
    """The interval table's header and rule."""
    rule = "  ".join("-" * w for _, w in COLUMNS)
    return _line([h for h, _ in COLUMNS]) + "\n" + rule


def interval_rows(iv: Interval) -> str:
    """One row per engine; the interval's own figures on the first."""
    own = [iv.index, iv.mode, f"{iv.t_s:.0f}", iv.sent, iv.answered, iv.equal]
    own += [iv.errors, iv.kill_errors, iv.cancelled, f"{iv.quiet_s:.1f}"]
    rows = []
    for n, e in enumerate(iv.engines):
        first = own if n == 0 else [""] * INTERVAL_COLUMNS
        counts = [e.moriio.get(k, "-") for k in ("handshakes", "failed", "peer_teardowns")]
        engine = [e.engine, e.incarnation, f"{e.up_s:.0f}", e.held_blocks, e.requests]
        engine += [f"{e.rss_mib:.0f}", e.fds]
        rows.append(_line([*first, *engine, e.processes, *counts]))
    for example in iv.error_examples:
        rows.append(f"    error: {example}")
    return "\n".join(rows)


def _per_h(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def slope_table(slopes: Sequence[Slope]) -> str:
    rows = [
        (
            s.mode,
            s.engine,
            s.incarnation,
            s.samples,
            f"{s.span_s:.0f}",
            _per_h(s.rss_mib_per_h),
            _per_h(s.fds_per_h),
            _per_h(s.held_blocks_per_h),
            "yes" if s.judged else "too short",
        )
        for s in slopes
    ]
    headers = (
        "mode",
        "engine",
        "inc",
        "samples",
        "span_s",
        "rss_MiB/h",
        "fds/h",
        "held/h",
        "judged",
    )
    return format_table(headers, rows, right=(2, 3, 4, 5, 6, 7))


def kill_table(kills: Sequence[Kill]) -> str:
    rows = [
        (
            k.mode,
            k.engine,
            f"{k.t_s:.0f}",
            k.in_flight,
            k.answered,
            k.errors,
            f"{k.restart_s:.1f}",
            f"{k.recovery_equal}/{k.recovery}",
        )
        for k in kills
    ]
    headers = ("mode", "killed", "t_s", "in_flight", "answered", "errors", "restart_s", "after")
    return format_table(headers, rows, right=(2, 3, 4, 5, 6))


def summary(result: SoakResult) -> str:
    """Totals, slopes per engine incarnation with their limits, kills, and the verdict."""
    t = result.totals()
    lines = [
        f"{t['intervals']} intervals: {t['sent']} requests sent, {t['answered']} answered, "
        f"{t['equal']} equal to the reference, {t['errors']} errors outside kills, "
        f"{t['kill_errors']} in flight at a kill; {t['cancelled']} cancelled mid-request",
        "",
        f"slopes per engine incarnation (its first {WARMUP_S:g} s left out); limits: RSS "
        f"{RSS_SLOPE_MAX_MIB_PER_H:g} MiB/h, fds {FDS_SLOPE_MAX_PER_H:g}/h, held blocks "
        f"{HELD_BLOCKS_SLOPE_MAX_PER_H:g}/h",
        slope_table(result.slopes),
    ]
    if result.kills:
        lines += ["", "kills (SIGKILL, restart on the same ports, then pool requests)"]
        lines.append(kill_table(result.kills))
    lines.append("")
    if result.ok:
        lines.append("PASS")
    else:
        lines += ["FAIL", *(f"  {f}" for f in result.failures)]
    lines.append(f"logs: {result.log_dir}")
    return "\n".join(lines)
