"""NIXL loopback transport benchmark (a script, not a test).

    .venv/bin/python benchmarks/bench_transport.py [--one-process] [--blocks 4096] ...

Prints throughput for 4096 x 64 KiB blocks (READ and WRITE, sequential and permuted block
order) next to ``np.copyto`` of the same bytes measured in the same run, the ratio, and
small-transfer latency p50/p99. Target: NIXL >= 0.8 x memcpy.
"""

from __future__ import annotations

import argparse

from moriio_tools.bench.nixl_engine import run_transport_benchmark

TARGET_RATIO = 0.8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=64 * 1024)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--latency-iterations", type=int, default=2000)
    parser.add_argument("--one-process", action="store_true", help="both agents in this process")
    args = parser.parse_args()
    r = run_transport_benchmark(
        num_blocks=args.blocks,
        block_size=args.block_size,
        repeats=args.repeats,
        latency_iterations=args.latency_iterations,
        two_processes=not args.one_process,
    )
    mib = r["region_bytes"] / 2**20
    print(
        f"NIXL loopback, {r['processes']} process(es): {r['num_blocks']} x "
        f"{r['block_size'] // 1024} KiB = {mib:.0f} MiB per batch, median of {r['repeats']}"
    )
    print(f"  READ bytes verified under a permutation: {r['verified']}")
    print(f"  np.copyto                      {r['memcpy_gbps']:6.2f} GB/s   (the reference)")
    for order in ("sequential", "permuted"):
        for op in ("read", "write"):
            key = f"{op}_{order}"
            ratio = r[f"{key}_ratio"]
            verdict = "ok" if ratio >= TARGET_RATIO else "below target"
            print(
                f"  NIXL {op.upper():5} {order:10}      {r[f'{key}_gbps']:6.2f} GB/s"
                f"   ratio {ratio:4.2f} x memcpy  ({verdict}, target {TARGET_RATIO})"
            )
    for size in (4096, 64 * 1024):
        p50, p99 = r[f"latency_{size}_p50_us"], r[f"latency_{size}_p99_us"]
        print(f"  latency READ {size // 1024:3d} KiB     p50 {p50:7.1f} us   p99 {p99:7.1f} us")


if __name__ == "__main__":
    main()
