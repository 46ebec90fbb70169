"""``moriio bench``: planner, transport and scheduler figures, each next to its reference.

Every reference is measured in the same run: the planner against vLLM's in-tree MoRIIO offset
computation and a naive loop, NIXL loopback against memcpy, the scheduler side against the
in-tree connector. ``--json`` prints one object with the sections ``planner``,
``transport`` and ``scheduler``; ``--out DIR`` also writes ``bench.json`` and PNG plots there.
``--e2e`` instead runs 1P1D ``vllm serve`` end to end against vLLM's NixlConnector;
``--soak DURATION`` keeps one under traffic, kills and cancels for that long; ``--stepped``
sets moriio against NixlConnector with both engines stepped without pause. ``--paths``
measures this host's figures for the path cost model (``moriio plan --figures`` reads the
JSON it prints).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from moriio.output import stdout_to_stderr, to_json
from moriio_tools.bench.plot import plots_unavailable
from moriio_tools.bench.render import render_section
from moriio_tools.bench.suite import SECTIONS, BenchOptions, run_sections, write_outputs
from moriio_tools.cli import bench_e2e, bench_soak, bench_stepped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--section",
        choices=(*SECTIONS, "all"),
        default="all",
        help="the figures to measure: planner cost, NIXL loopback transport, scheduler side",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", type=Path, help="directory for bench.json and PNG plots")
    parser.add_argument("--repeat", type=int, default=5, help="timing rounds (median)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the in-tree vLLM references")
    parser.add_argument(
        "--one-process", action="store_true", help="NIXL target engine in this process"
    )
    parser.add_argument(
        "--chaos",
        action="store_true",
        help="instead of the sections: seeded fault-injection simulations with invariant checks",
    )
    parser.add_argument("--seeds", type=int, default=100_000, help="--chaos: simulations to run")
    parser.add_argument(
        "--paths",
        action="store_true",
        help="instead of the sections: this host's figures for the path cost model",
    )
    parser.add_argument("--workers", type=int, help="--chaos: processes (default: CPU count)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, one round: a smoke test whose figures are not comparable",
    )
    bench_e2e.add_arguments(parser)
    bench_soak.add_arguments(parser)
    bench_stepped.add_arguments(parser)


def run_chaos(args: argparse.Namespace) -> int:
    from moriio_tools.bench.chaos import measure_chaos, render_chaos

    data = measure_chaos(seeds=args.seeds, workers=args.workers)
    print(to_json({"chaos": data}) if args.json else render_chaos(data))
    return 1 if data["invariant_violations"] else 0


def run_paths(args: argparse.Namespace) -> int:
    from moriio_tools.bench.path_figures import measure_path_figures, render_path_figures

    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    quick = {"total_bytes": 1 << 20, "descriptors": 64, "repeats": 1} if args.quick else {}
    with stdout_to_stderr():
        data = measure_path_figures(**quick)
    print(to_json(data) if args.json else render_path_figures(data))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.chaos:
        return run_chaos(args)
    if args.paths:
        return run_paths(args)
    plots = args.e2e or (args.soak is None and not args.stepped)
    if args.out is not None and plots and (missing := plots_unavailable()) is not None:
        print(f"moriio bench: error: {missing}", file=sys.stderr)  # before a long run
        return 2
    if args.e2e:
        return bench_e2e.run_e2e_command(args)
    if args.soak is not None:
        return bench_soak.run_soak_command(args)
    if args.stepped:
        return bench_stepped.run_stepped_command(args)
    sections = SECTIONS if args.section == "all" else (args.section,)
    options = BenchOptions(
        repeat=args.repeat,
        use_vllm=not args.no_vllm,
        two_processes=not args.one_process,
        quick=args.quick,
    )
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

    def announce(section: str, data: dict[str, Any]) -> None:
        if not args.json:
            print(render_section(section, data) + "\n", flush=True)

    if args.json:
        with stdout_to_stderr():
            result = run_sections(sections, options)
    else:
        result = run_sections(sections, options, on_section=announce)
    if args.out is not None:
        with stdout_to_stderr():
            paths = write_outputs(result, args.out)
        where = sys.stderr if args.json else sys.stdout
        print("wrote " + ", ".join(str(p) for p in paths), file=where)
    if args.json:
        print(to_json(result))
    return 0
