"""The soak's verdict: equal answers, no block held when quiet, flat resource slopes.

Slopes are least squares over one engine *incarnation* (a restart starts its RSS and
descriptors over, so series never span a restart), leaving out its warm-up: the samples of
its first :data:`WARMUP_S`, while its allocators and caches still grow to the working set of
the traffic (the largest batches and prompts first seen). A series needs
:data:`MIN_SLOPE_SAMPLES` samples over at least :data:`MIN_SLOPE_SPAN_S` after that to be
judged; shorter ones are reported only. With kills every few minutes the engine killed
keeps few samples; the survivor's series spans the mode.
"""

from __future__ import annotations

from collections.abc import Sequence

from moriio_tools.serve.metrics import prompt_kv_shortfall
from moriio_tools.soak.records import EngineSample, Interval, Kill, Slope

HOUR_S = 3600.0
# RSS (an engine's is ~2.8 GiB on the CPU demo): an engine's RSS keeps growing for its first
# minutes, to the working set of the traffic, and then stays flat. In the hour's run engines
# grew by 20-70 MiB between ages of 2 and 5 minutes: up to ~1,200 MiB/h for a READ prefill
# and ~1,900 MiB/h for a WRITE prefill over that window; decodes were flat after 3 minutes
# (0-660 MiB/h). The soak answers some 10^4 requests an hour on the 2-core reference machine:
# 4,096 MiB/h, twice the steepest warm-up measured, is a leak of ~400 KiB per request. A
# slower leak needs an engine that lives longer than the kill schedule lets it (an hour's
# run with rare kills), not a tighter limit on a short series.
RSS_SLOPE_MAX_MIB_PER_H = 4096.0
# Descriptors: at a quiet point (idle HTTP connections closed) an engine's count is fixed:
# 216 and 218 at every quiet point of the reference run. One descriptor leaked per burst (one
# a minute or more) is >= 60/h, and a step of 3 descriptors at the end of a 3-minute series
# weighs < 50/h; one leaked per kill or reconnect needs a longer soak to show.
FDS_SLOPE_MAX_PER_H = 60.0
# Held blocks must be 0 at every quiet interval end (checked on its own): any growth fails.
HELD_BLOCKS_SLOPE_MAX_PER_H = 0.0
WARMUP_S = 120.0  # an incarnation's samples left out: in the reference run RSS still grew
# 21 MiB between its first two quiet points (45 s and 90 s), 3 MiB over the next 73 s
MIN_SLOPE_SAMPLES = 3
MIN_SLOPE_SPAN_S = 90.0


def slope_per_hour(times_s: Sequence[float], values: Sequence[float]) -> float | None:
    """Least-squares slope of ``values`` over ``times_s`` (seconds), per hour; None with
    fewer than two distinct times."""
    if len(times_s) != len(values):
        raise ValueError("times and values differ in length")
    n = len(times_s)
    if n < 2:
        return None
    mean_t = sum(times_s) / n
    mean_v = sum(values) / n
    spread = sum((t - mean_t) ** 2 for t in times_s)
    if spread == 0:
        return None
    covariance = sum((t - mean_t) * (v - mean_v) for t, v in zip(times_s, values, strict=True))
    return covariance / spread * HOUR_S


def series(
    intervals: Sequence[Interval],
) -> dict[tuple[str, str, int], list[tuple[float, EngineSample]]]:
    """Every engine incarnation's quiet samples, in time order, by (mode, engine, incarnation)."""
    out: dict[tuple[str, str, int], list[tuple[float, EngineSample]]] = {}
    for interval in intervals:
        for sample in interval.engines:
            key = (interval.mode, sample.engine, sample.incarnation)
            out.setdefault(key, []).append((interval.t_s, sample))
    return out


def slopes(intervals: Sequence[Interval]) -> list[Slope]:
    """One :class:`Slope` per engine incarnation, its warm-up left out."""
    out = []
    for (mode, engine, incarnation), points in series(intervals).items():
        kept = [(t, s) for t, s in points if s.up_s >= WARMUP_S]
        times = [t for t, _ in kept]
        span = times[-1] - times[0] if times else 0.0

        def fit(values: list[float], times: list[float] = times) -> float | None:
            slope = slope_per_hour(times, values)
            return None if slope is None else round(slope, 2)

        out.append(
            Slope(
                mode=mode,
                engine=engine,
                incarnation=incarnation,
                samples=len(kept),
                span_s=round(span, 1),
                rss_mib_per_h=fit([s.rss_mib for _, s in kept]),
                fds_per_h=fit([float(s.fds) for _, s in kept]),
                held_blocks_per_h=fit([float(s.held_blocks) for _, s in kept]),
                judged=len(kept) >= MIN_SLOPE_SAMPLES and span >= MIN_SLOPE_SPAN_S,
            )
        )
    return out


def slope_failures(slope: Slope) -> list[str]:
    """What exceeds its threshold in a judged series (nothing for one too short)."""
    if not slope.judged:
        return []
    name = f"{slope.mode} {slope.engine}#{slope.incarnation}"
    limits = (
        ("RSS", slope.rss_mib_per_h, RSS_SLOPE_MAX_MIB_PER_H, "MiB/h"),
        ("open fds", slope.fds_per_h, FDS_SLOPE_MAX_PER_H, "/h"),
        ("held blocks", slope.held_blocks_per_h, HELD_BLOCKS_SLOPE_MAX_PER_H, "/h"),
    )
    return [
        f"{name}: {what} grows {value:+.1f}{unit} (limit {limit:g}{unit})"
        for what, value, limit, unit in limits
        if value is not None and value > limit
    ]


def verdict(intervals: Sequence[Interval], kills: Sequence[Kill]) -> list[str]:
    """Why the soak failed; empty when it passed. Errors in flight during a kill are
    allowed; every other error, any answer unequal to the reference, any block held at a
    quiet interval end, any request unanswered or wrong after a restart and any judged
    slope over its threshold fail it."""
    failures = []
    for iv in intervals:
        where = f"interval {iv.index} ({iv.mode})"
        if iv.mismatches:
            failures.append(f"{where}: {iv.mismatches} answers differ from the reference")
        if iv.errors:
            examples = "; ".join(iv.error_examples)
            failures.append(f"{where}: {iv.errors} requests failed outside a kill: {examples}")
        held = {s.engine: s.held_blocks for s in iv.engines if s.held_blocks}
        if held:
            failures.append(f"{where}: blocks held at the quiet end {held}")
    for kill in kills:
        if kill.recovery_equal != kill.recovery:
            failures.append(
                f"{kill.mode} {kill.engine} restart at {kill.t_s:.0f} s: only "
                f"{kill.recovery_equal} of {kill.recovery} requests after it answered equal"
            )
        shortfall = prompt_kv_shortfall(kill.recovery_sources, kill.recovery_prompt_tokens)
        if shortfall is not None:
            failures.append(
                f"{kill.mode} {kill.engine} restart at {kill.t_s:.0f} s: the decode did not load "
                f"the prompts after it over the wire ({shortfall})"
            )
    for slope in slopes(intervals):
        failures += slope_failures(slope)
    return failures
