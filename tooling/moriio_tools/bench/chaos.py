"""``moriio bench --chaos``: many seeded fault-injection simulations, invariants checked."""

from __future__ import annotations

import time
from typing import Any

from moriio_tools.sim import run_seeds
from moriio_tools.sim.report import SimReport, default_workers

DEFAULT_SEEDS = 100_000
DEFAULT_REQUESTS = 100


def measure_chaos(
    *, seeds: int = DEFAULT_SEEDS, requests: int = DEFAULT_REQUESTS, workers: int | None = None
) -> dict[str, Any]:
    """Run ``seeds`` simulations (READ and WRITE alternate); report runs, faults, violations."""
    started = time.perf_counter()
    report = run_seeds(range(seeds), requests, "both", workers=workers or default_workers())
    return chaos_summary(report, time.perf_counter() - started)


def chaos_summary(report: SimReport, seconds: float) -> dict[str, Any]:
    return {
        "runs": report.runs,
        "requests": report.requests,
        "runs_by_mode": dict(report.runs_by_mode),
        "faults_injected": report.faults_injected,
        "faults": dict(sorted(report.faults.items())),
        "outcomes": dict(sorted(report.outcomes.items())),
        "invariant_violations": len(report.violations),
        "violations": [
            {"seed": v.seed, "kind": v.kind, "message": v.message, "repro": v.repro}
            for v in report.violations[:20]
        ],
        "liveness_findings": len(report.findings),
        "seconds": round(seconds, 1),
    }


def render_chaos(data: dict[str, Any]) -> str:
    lines = [
        f"chaos: {data['runs']} seeded runs, {data['requests']} requests, "
        f"{data['faults_injected']} faults injected in {data['seconds']} s",
        *(f"  {kind}: {n}" for kind, n in data["faults"].items()),
        f"invariant violations: {data['invariant_violations']}",
        *(
            f"  seed {v['seed']}: {v['kind']}: {v['message']}\n    {v['repro']}"
            for v in data["violations"]
        ),
    ]
    if data["liveness_findings"]:
        lines.append(f"liveness findings (not invariants): {data['liveness_findings']}")
    return "\n".join(lines)
