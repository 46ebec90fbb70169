"""Transfer-planner benchmark: vectorised plan vs a naive per-block Python loop, same run.

Plans 2048 random block ids (Python int lists, as vLLM passes them; the remote ids are an
independent random sample) on a separated bf16 layout ``[2, 8192, 16, 8, 128]`` and prints
microseconds per plan, the speed-up over :func:`plan_transfer_naive` measured in the same
run, and the cost of a plan-cache hit for another layer of the same geometry.

    .venv/bin/python benchmarks/bench_planner.py [--json] [--check]

``--check`` exits with status 1 when a target is missed (plan <= 130 us, >= 15x faster than
the naive loop, cached lookup < 2 us). Timings are the median of several repeats.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import timeit
from collections.abc import Callable
from typing import Any

from moriio.domain.layout import LayerSpec, describe_layout
from moriio.domain.plan_cache import PlanCache
from moriio.domain.planner import plan_transfer, plan_transfer_naive

TARGET_PLAN_US = 130.0
TARGET_SPEEDUP = 15.0
TARGET_CACHED_US = 2.0


def _dense_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def _per_call_us(fn: Callable[[], object], number: int, repeat: int) -> tuple[float, float]:
    """(median, best) microseconds per call over ``repeat`` rounds of ``number`` calls."""
    rounds = timeit.Timer(fn).repeat(repeat=repeat, number=number)
    per_call = [r / number * 1e6 for r in rounds]
    return statistics.median(per_call), min(per_call)


def run_planner_benchmark(
    *,
    num_ids: int = 2048,
    num_blocks: int = 8192,
    block_size: int = 16,
    num_kv_heads: int = 8,
    head_size: int = 128,
    itemsize: int = 2,
    repeat: int = 7,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure the planner on a separated ``[2, nb, bs, H, D]`` layout; returns the numbers."""
    shape = (2, num_blocks, block_size, num_kv_heads, head_size)
    spec = LayerSpec(block_size, num_kv_heads, head_size)
    layer0 = describe_layout(shape, _dense_strides(shape), itemsize, spec)
    layer1 = describe_layout(shape, _dense_strides(shape), itemsize, spec)
    rng = random.Random(seed)
    local = rng.sample(range(num_blocks), num_ids)
    remote = rng.sample(range(num_blocks), num_ids)

    plan = plan_transfer(layer0, local, remote, num_blocks)
    naive = plan_transfer_naive(layer0, local, remote, num_blocks)
    if plan.total_bytes != sum(naive[2]):
        raise AssertionError("vectorised and naive plans move different byte counts")

    plan_us, plan_best = _per_call_us(
        lambda: plan_transfer(layer0, local, remote, num_blocks), 200, repeat
    )
    naive_us, naive_best = _per_call_us(
        lambda: plan_transfer_naive(layer0, local, remote, num_blocks), 10, repeat
    )
    cache = PlanCache(local, remote, num_blocks)
    cache.plan_for(layer0)
    cached_us, cached_best = _per_call_us(lambda: cache.plan_for(layer1), 100_000, repeat)

    runs_local = list(range(100, 100 + num_ids))
    runs_remote = list(range(num_blocks - num_ids, num_blocks))
    coalesced = plan_transfer(layer0, runs_local, runs_remote, num_blocks)
    coalesced_us, _ = _per_call_us(
        lambda: plan_transfer(layer0, runs_local, runs_remote, num_blocks), 200, repeat
    )

    speedup = naive_us / plan_us
    return {
        "layout": f"separated {list(shape)} itemsize={itemsize}",
        "num_ids": num_ids,
        "descriptors": plan.num_descriptors,
        "total_bytes": plan.total_bytes,
        "plan_us": round(plan_us, 2),
        "plan_best_us": round(plan_best, 2),
        "naive_us": round(naive_us, 1),
        "naive_best_us": round(naive_best, 1),
        "speedup": round(speedup, 1),
        "cached_lookup_us": round(cached_us, 3),
        "cached_lookup_best_us": round(cached_best, 3),
        "contiguous_plan_us": round(coalesced_us, 2),
        "contiguous_descriptors": coalesced.num_descriptors,
        "targets": {
            "plan_us_max": TARGET_PLAN_US,
            "speedup_min": TARGET_SPEEDUP,
            "cached_lookup_us_max": TARGET_CACHED_US,
        },
        "meets_targets": plan_us <= TARGET_PLAN_US
        and speedup >= TARGET_SPEEDUP
        and cached_us < TARGET_CACHED_US,
    }


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
