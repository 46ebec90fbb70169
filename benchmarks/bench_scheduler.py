"""Scheduler-side connector cost per step: moriio vs vLLM 0.32's in-tree MoRIIO connector.

Drives vLLM's real v1 Scheduler on CPU in four roles (consumer/producer x READ/WRITE) with
``--live`` transferring requests and a fake worker, once per connector on the same seeded
workload, and prints per role the median connector time per step of ours, of the in-tree
connector and of a shape-matched no-op connector (the harness floor, not subtracted), their
ratio and the pickled metadata per step. See :mod:`moriio_tools.bench.scheduler`.

    .venv/bin/python benchmarks/bench_scheduler.py [--live 128 512] [--steps 30] [--json]

``--check`` exits with status 1 when ours costs more than the in-tree connector in a role.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from moriio.output import fmt_bytes, fmt_num, format_table, stdout_to_stderr, to_json
from moriio_tools.bench.scheduler import DEFAULT_STEPS, GOAL_RATIO, ROLES, measure_scheduler


def _bytes(value: object) -> str:
    return fmt_bytes(int(value)) if isinstance(value, int | float) else "n/a"


def render(result: dict[str, Any]) -> str:
    lines = []
    for row in result.get("series", []):
        live = row["live_requests"]
        lines.append(f"{live} live requests, median connector time per step (us):")
        rows = []
        for role, figures in row["per_role"].items():
            rows.append(
                [
                    role,
                    fmt_num(figures.get("us_per_step"), ".1f"),
                    fmt_num(figures.get("vllm_us_per_step"), ".1f"),
                    fmt_num(figures.get("ratio"), ".2f"),
                    fmt_num(figures.get("noop_us_per_step"), ".1f"),
                    _bytes(figures.get("metadata_bytes_per_step")),
                    _bytes(figures.get("vllm_metadata_bytes_per_step")),
                    fmt_num(figures.get("new_requests_per_step"), ".1f"),
                ]
            )
        rows.append(
            [
                "sum",
                fmt_num(row.get("us_per_step"), ".1f"),
                fmt_num(row.get("vllm_us_per_step"), ".1f"),
                fmt_num(_ratio(row.get("us_per_step"), row.get("vllm_us_per_step")), ".2f"),
                fmt_num(row.get("noop_us_per_step"), ".1f"),
                "",
                "",
                "",
            ]
        )
        headers = ["role", "moriio", "in-tree", "ratio", "no-op", "meta", "in-tree meta", "new"]
        lines.append(format_table(headers, rows, right=(1, 2, 3, 4, 5, 6, 7)))
        lines.append("")
    reasons = {k: v for k, v in result.items() if k.endswith("_reason")}
    for key, reason in reasons.items():
        lines.append(f"{key.removesuffix('_reason')}: not measured ({reason})")
    lines.append(
        f"headline ({result.get('headline', 'n/a')}): {result.get('headline_role')} "
        f"moriio {fmt_num(result.get('us_per_step'), '.1f')} us vs in-tree "
        f"{fmt_num(result.get('vllm_us_per_step'), '.1f')} us, ratio "
        f"{fmt_num(result.get('ratio'), '.2f')} (target <= 1: {_met(result, 'meets_target')}; "
        f"goal <= {GOAL_RATIO:g} in every role: {_met(result, 'meets_goal')})"
    )
    load = result.get("load_average") or {}
    if load:
        lines.append(
            f"1-min load average: {fmt_num(load.get('before'), '.2f')} before, "
            f"{fmt_num(load.get('after'), '.2f')} after (co-tenants inflate the figures)"
        )
    return "\n".join(lines)


def _ratio(ours: object, theirs: object) -> float | None:
    if isinstance(ours, int | float) and isinstance(theirs, int | float) and theirs:
        return ours / theirs
    return None


def _met(result: dict[str, Any], key: str) -> str:
    value = result.get(key)
    return "not measured" if value is None else ("met" if value else "MISSED")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--live", type=int, nargs="+", default=[512], help="live requests")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="measured steps")
    parser.add_argument("--roles", nargs="+", choices=ROLES, default=list(ROLES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-vllm", action="store_true", help="skip the in-tree reference")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--check", action="store_true", help="exit 1 when ours is slower")
    args = parser.parse_args(argv)
    live = max(args.live)
    with stdout_to_stderr():
        result = measure_scheduler(
            live=live,
            steps=args.steps,
            roles=args.roles,
            seed=args.seed,
            use_vllm=not args.no_vllm,
            series_live=[n for n in args.live if n != live],
        )
    print(to_json(result, indent=1) if args.json else render(result))
    return 1 if args.check and result.get("meets_target") is False else 0


if __name__ == "__main__":
    sys.exit(main())
