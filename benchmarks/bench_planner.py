"""Transfer-planner benchmark: vectorised plan vs a naive per-block Python loop, same run.

Plans 2048 random block ids (Python int lists, as vLLM passes them; the remote ids are an
independent random sample) on a separated bf16 layout ``[2, 8192, 16, 8, 128]`` and prints
microseconds per plan, the speed-up over :func:`plan_transfer_naive` measured in the same
run, and the cost of a plan-cache hit for another layer of the same geometry.

    .venv/bin/python benchmarks/bench_planner.py [--json] [--check]

``--check`` exits with status 1 when a target is missed (plan <= 130 us, >= 15x faster than
the naive loop, cached lookup < 2 us). Timings are the median of several repeats. The
comparison with vLLM's in-tree MoRIIO code is ``moriio bench --section planner``; both use
:mod:`moriio_tools.bench.planner`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from moriio_tools.bench.planner import (
    TARGET_CACHED_US,
    TARGET_PLAN_US,
    TARGET_SPEEDUP,
    run_planner_benchmark,
)


def _print_text(result: dict[str, Any]) -> None:
    print(f"layout: {result['layout']}, {result['num_ids']} random block ids (int lists)")
    print(
        f"plan:           {result['plan_us']:9.2f} us/plan (best {result['plan_best_us']:.2f}), "
        f"{result['descriptors']} descriptors, {result['total_bytes']} bytes"
        f"  [target <= {TARGET_PLAN_US:g} us]"
    )
    print(f"naive loop:     {result['naive_us']:9.1f} us/plan (best {result['naive_best_us']:.1f})")
    print(f"speed-up:       {result['speedup']:9.1f} x  [target >= {TARGET_SPEEDUP:g} x]")
    print(
        f"cached lookup:  {result['cached_lookup_us']:9.3f} us (another layer, same geometry)"
        f"  [target < {TARGET_CACHED_US:g} us]"
    )
    print(
        f"contiguous ids: {result['contiguous_plan_us']:9.2f} us/plan, "
        f"{result['contiguous_descriptors']} descriptors"
    )
    print("targets met" if result["meets_targets"] else "TARGETS MISSED")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--repeat", type=int, default=7, help="timing rounds (median)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = run_planner_benchmark(repeat=args.repeat, seed=args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        _print_text(result)
    return 1 if args.check and not result["meets_targets"] else 0


if __name__ == "__main__":
    sys.exit(main())
