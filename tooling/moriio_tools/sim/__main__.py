"""``python -m moriio_tools.sim``: replay one seeded run, or run many and summarise them."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from moriio_tools.sim.report import mode_of, run_seeds
from moriio_tools.sim.run import run_one


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moriio_tools.sim",
        description="Deterministic fault-injection simulation of a producer and a consumer.",
    )
    parser.add_argument("--seed", type=int, default=0, help="the (first) seed to run")
    parser.add_argument(
        "--seeds", type=int, default=1, help="how many consecutive seeds to run (default 1)"
    )
    parser.add_argument("--mode", choices=("read", "write", "both"), default="both")
    parser.add_argument("--requests", type=int, default=100, help="requests per run")
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.requests < 1 or args.workers < 1:
        parser.error("--seeds, --requests and --workers must be >= 1")
    started = time.perf_counter()
    if args.seeds == 1:
        result = run_one(args.seed, args.requests, mode_of(args.seed, args.mode))
        faults = ", ".join(f"{k} {n}" for k, n in sorted(result.faults.items()))
        outcomes = ", ".join(f"{k} {n}" for k, n in sorted(result.outcomes.items()))
        print(
            f"seed {result.seed} ({result.mode.value}), {result.requests} requests, "
            f"{result.ticks} ticks"
        )
        print(f"faults: {faults or 'none'}")
        print(f"outcomes: {outcomes or 'none'}")
        if result.finding is not None:
            print(f"liveness finding (not an invariant): {result.finding}")
        if result.violation is not None:
            print(f"INVARIANT VIOLATION: {result.violation}")
            print(f"reproduce: {result.repro}")
            return 1
        print("invariants hold")
        return 0
    seeds = range(args.seed, args.seed + args.seeds)
    report = run_seeds(seeds, args.requests, args.mode, workers=args.workers)
    print(report.summary())
    print(f"elapsed: {time.perf_counter() - started:.1f} s")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
