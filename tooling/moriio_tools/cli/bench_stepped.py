"""``moriio bench --stepped``: moriio against NixlConnector (progress thread off), both engines
of each 1P1D pair stepped as vLLM's engine core steps them (see :mod:`moriio_tools.stepped`),
one table per binding configuration.

Takes ``--bindings`` (of ``vllm-defaults``, ``defaults-passive``, ``unbound-2``,
``unbound-1``, ``own-cores``; all by default) and ``--idle-seconds`` (30: how long each pair
of the first round stays idle, measured, before its cases; 0 skips it), and from the other
modes ``--requests`` (per case and round), ``--rounds``, ``--log-dir``, ``--json``,
``--connectors`` (of ``moriio-read``, ``moriio-write``, ``nixl-progress-off``; all by
default) and ``--cases`` (``short-4``, ``long-4`` by default; ``mixed-128`` adds the
prefill-alone limit). Exits 1 if a moriio answer differed from the reference or failed, 2 on
a bad argument.
"""

from __future__ import annotations

import argparse
import sys

from moriio.output import to_json
from moriio_tools.serve.e2e_report import DEFAULT_CASES as E2E_CASES
from moriio_tools.serve.e2e_report import DEFAULT_CONNECTORS
from moriio_tools.stepped.bindings import BINDINGS, DEFAULT_BINDINGS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--stepped")
    group.add_argument(
        "--stepped",
        action="store_true",
        help="instead of the sections: moriio READ/WRITE vs NixlConnector with its progress "
        "thread off and a colocated engine, both engines stepped as vLLM's engine core steps "
        "them (--cases: short-4, long-4 by default; mixed-128 adds the prefill-alone limit)",
    )
    group.add_argument(
        "--bindings",
        default=",".join(DEFAULT_BINDINGS),
        help="--stepped: comma-separated configurations of cores and OpenMP threads, of "
        f"{', '.join(BINDINGS)} (one table each)",
    )
    group.add_argument(
        "--idle-seconds",
        type=float,
        default=30.0,
        help="--stepped: each first-round pair idle this long, measured (0: skip)",
    )


def run_stepped_command(args: argparse.Namespace) -> int:
    from moriio_tools.stepped.bench import (
        DEFAULT_CASES,
        SteppedConfig,
        render_stepped,
        run_stepped,
    )
    from moriio_tools.stepped.pair import STEPPED_CONNECTORS

    named = tuple(n for n in args.connectors.split(",") if n)
    given = args.connectors != ",".join(DEFAULT_CONNECTORS)  # --e2e's default: not named
    connectors = named if given else STEPPED_CONNECTORS
    cases = tuple(n for n in args.cases.split(",") if n)
    if args.cases == ",".join(E2E_CASES):  # --e2e's default: not named
        cases = DEFAULT_CASES
    try:
        config = SteppedConfig(
            connectors=connectors,
            cases=cases,
            requests=args.requests,
            rounds=args.rounds,
            bindings=tuple(n for n in args.bindings.split(",") if n),
            idle_s=args.idle_seconds,
            log_dir=args.log_dir,
        )
    except ValueError as exc:
        print(f"moriio bench --stepped: {exc}", file=sys.stderr)
        return 2

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    result = run_stepped(config, progress)
    print(to_json(result) if args.json else render_stepped(result))
    moriio = [r for r in result["runs"] if r["connector"].startswith("moriio")]
    return 0 if all(r["equal"] == r["requests"] for r in moriio) else 1
