"""``moriio bench --soak DURATION``: a 1P1D ``vllm serve`` deployment under traffic for long.

See :mod:`moriio_tools.soak.runner` for what runs. Prints a table row per interval and engine
while it runs, then slopes, kills and the verdict; ``--json`` prints one object at the end
(the table goes to stderr). Exits 1 if an answer differed from the reference, a request failed
outside a kill, a block stayed held when quiet or a resource slope exceeded its limit.
"""

from __future__ import annotations

import argparse
import sys
import time

from moriio.output import to_json
from moriio_tools.soak.config import SoakConfig, parse_duration


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration_or_never(text: str) -> float:
    return 0.0 if text.strip() in ("0", "0s", "never") else _duration(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--soak")
    group.add_argument(
        "--soak",
        type=_duration,
        metavar="DURATION",
        help="instead of the sections: 1P1D vllm serve under traffic, kills and cancels for "
        "DURATION (600s, 10m, 1h), READ then WRITE",
    )
    group.add_argument(
        "--soak-interval",
        type=_duration,
        default=60.0,
        metavar="DURATION",
        help="--soak: one report per interval (default 60s)",
    )
    group.add_argument(
        "--soak-kill-every",
        type=_duration_or_never,
        default=180.0,
        metavar="DURATION",
        help="--soak: SIGKILL and restart the prefill or the decode engine, in turn, this "
        "often (default 180s; 0: never)",
    )
    group.add_argument(
        "--soak-burst", type=int, default=128, help="--soak: requests in flight in a burst"
    )


def config_from(args: argparse.Namespace) -> SoakConfig:
    return SoakConfig(
        duration_s=args.soak,
        interval_s=args.soak_interval,
        kill_every_s=args.soak_kill_every,
        burst=args.soak_burst,
        log_dir=args.log_dir,
    )


def run_soak_command(args: argparse.Namespace) -> int:
    from moriio.cli import shutdown
    from moriio_tools.serve.processes import ProcessError
    from moriio_tools.soak.records import Interval
    from moriio_tools.soak.report import header, interval_rows, summary
    from moriio_tools.soak.runner import run_soak

    config = config_from(args)
    try:
        config.validate()
    except ValueError as exc:
        print(f"moriio bench --soak: error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    shutdown.install()  # a signal to the bench stops every process it started
    table = sys.stderr if args.json else sys.stdout

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", file=sys.stderr, flush=True)

    shown: list[Interval] = []

    def on_interval(interval: Interval) -> None:
        if not shown:
            print(header(), file=table, flush=True)
        shown.append(interval)
        print(interval_rows(interval), file=table, flush=True)

    try:
        result = run_soak(config, progress, on_interval)
    except (ProcessError, RuntimeError) as exc:
        print(f"moriio bench --soak: failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(to_json(result.to_dict()))
    else:
        print("\n" + summary(result))
    return 0 if result.ok else 1
