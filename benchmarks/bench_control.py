"""Control-channel round-trip latency on loopback (ZMQ request/reply and send+drain ping-pong).

A bare DEALER/ROUTER echo measured in the same run is printed as the reference.

Run: .venv/bin/python benchmarks/bench_control.py [--samples N] [--warmup N] [--hmac]
Prints p50/p99 in microseconds with the number of samples; the target is a request/reply
p50 within 2x the raw echo's p50 measured in the same run (the channel adds the codec, the
envelope and a listener thread's hop to a bare socket round trip).
"""

from __future__ import annotations

import argparse
import os

from moriio_tools.bench.zmq_channel import run_control_benchmark

TARGET_RATIO = 2.0  # request/reply p50 over the raw DEALER/ROUTER echo p50, same run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--hmac", action="store_true", help="also measure with a shared secret")
    args = parser.parse_args()

    runs = [run_control_benchmark(args.samples, args.warmup)]
    if args.hmac:
        runs.append(run_control_benchmark(args.samples, args.warmup, secret=os.urandom(32)))
    print(f"{'mode':<26}{'samples':>9}{'p50 us':>10}{'p99 us':>10}{'mean us':>10}")
    for run in runs:
        suffix = " +hmac" if run["hmac"] else ""
        for mode in ("raw_zmq", "request_reply", "send_drain"):
            stats = run[mode]
            print(
                f"{mode + suffix:<26}{int(stats['samples']):>9}{stats['p50_us']:>10.1f}"
                f"{stats['p99_us']:>10.1f}{stats['mean_us']:>10.1f}"
            )
        print(f"request/reply p50 / raw zmq p50{suffix}: {run['request_reply_vs_raw']:.2f}x")
    ratio = runs[0]["request_reply_vs_raw"]
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    print(f"request/reply {ratio:.2f}x the raw echo {verdict} the target of {TARGET_RATIO:.1f}x")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
