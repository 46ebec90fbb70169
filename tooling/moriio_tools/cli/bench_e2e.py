"""``moriio bench --e2e``: 1P1D ``vllm serve`` end to end, moriio against vLLM's NixlConnector.

See :mod:`moriio_tools.serve.e2e` for what runs. Prints a table per connector and case and,
per case, moriio's best mode against NixlConnector's best; ``--json`` prints one object;
``--out DIR`` also writes ``e2e.json`` and ``e2e.png`` there.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from moriio.output import to_json
from moriio_tools.serve.e2e_report import (
    CASES,
    CONNECTORS,
    DEFAULT_CASES,
    DEFAULT_CONNECTORS,
    E2E_PNG,
    aggregate,
    plot_e2e,
    render_table,
    render_verdicts,
    verdicts,
    with_prefill_limit,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--e2e")
    group.add_argument(
        "--e2e",
        action="store_true",
        help="instead of the sections: 1P1D vllm serve, moriio vs vLLM's NixlConnector",
    )
    group.add_argument("--requests", type=int, default=16, help="--e2e: requests per case/round")
    group.add_argument("--rounds", type=int, default=3, help="--e2e: rounds over the connectors")
    group.add_argument(
        "--connectors",
        default=",".join(DEFAULT_CONNECTORS),
        help=f"--e2e: comma-separated, of {', '.join(CONNECTORS)} "
        f"(default {','.join(DEFAULT_CONNECTORS)})",
    )
    group.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help=f"--e2e: comma-separated, of {', '.join(c.name for c in CASES)} "
        f"(default {','.join(DEFAULT_CASES)})",
    )
    group.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        help="--e2e: seconds before a request counts as failed",
    )
    group.add_argument(
        "--explain",
        action="store_true",
        help="--e2e: record moriio's per-request timelines; print where each case's time goes",
    )
    group.add_argument(
        "--first-token-ahead",
        action="store_true",
        help="--e2e: every P/D router streams the prefill's first token at once "
        "(moriio router --first-token-ahead; the peers' proxies alike)",
    )
    group.add_argument(
        "--vllm-bench",
        action="store_true",
        help="--e2e: also drive every deployment with vllm bench serve (random dataset)",
    )
    group.add_argument(
        "--concurrency",
        type=concurrency_levels,
        default="1,4,16",
        help="--vllm-bench: the --max-concurrency levels, comma-separated",
    )
    group.add_argument(
        "--goodput",
        default="ttft:500,tpot:50",
        help="--vllm-bench: SLOs in ms, comma-separated (ttft, tpot, e2el)",
    )
    group.add_argument(
        "--log-dir", default=None, help="--e2e, --soak: engine logs (default: temp dir)"
    )


def concurrency_levels(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` -> ``(1, 4, 16)``; argparse names the flag when this raises."""
    try:
        levels = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers of 1 or more, got {text!r}"
        )
    return levels


def config_from(args: argparse.Namespace) -> Any:
    """The :class:`moriio_tools.serve.e2e.E2EConfig` of the command line."""
    from moriio_tools.serve.e2e import E2EConfig
    from moriio_tools.serve.vllm_bench import SweepConfig

    quick = bool(getattr(args, "quick", False))
    sweep = None
    if getattr(args, "vllm_bench", False):
        sweep = SweepConfig(
            concurrencies=tuple(args.concurrency),
            goodput=tuple(n for n in args.goodput.split(",") if n),
        )
    return E2EConfig(
        connectors=tuple(n for n in args.connectors.split(",") if n),
        cases=tuple(n for n in args.cases.split(",") if n),
        requests=2 if quick else args.requests,
        rounds=1 if quick else args.rounds,
        log_dir=args.log_dir,
        request_timeout_s=args.request_timeout,
        explain=bool(getattr(args, "explain", False)),
        sweep=sweep,
        first_token_ahead=bool(getattr(args, "first_token_ahead", False)),
    )


def result_of(runs: list[Any], log_dir: str, raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The rows and verdicts of ``runs``; ``raw``: :func:`run_e2e`'s result, whose timelines
    (``explained``) and ``vllm bench serve`` rows (``sweep``) are kept when present."""
    rows = with_prefill_limit(aggregate(runs))
    out = {"rows": rows, "verdicts": verdicts(rows), "log_dir": log_dir}
    for key in ("explained", "sweep"):
        if raw and raw.get(key):
            out[key] = raw[key]
    return out


def render_explained(explained: list[dict[str, Any]]) -> str:
    """One stage table per connector, case and round."""
    from moriio_tools.serve.timeline_report import StageFigure, render_explain

    return "\n\n".join(
        render_explain(
            f"{e['connector']} {e['case']} round {e['round'] + 1}: where the time goes",
            [StageFigure(**f) for f in e["stages"]],
        )
        for e in explained
    )


def run_e2e_command(args: argparse.Namespace) -> int:
    from moriio.cli import shutdown
    from moriio_tools.serve.e2e import run_e2e
    from moriio_tools.serve.processes import ProcessError
    from moriio_tools.serve.vllm_bench import SWEEP_PNG, plot_sweep, render_sweep

    try:
        config = config_from(args)
        config.validate()
    except ValueError as exc:
        print(f"moriio bench --e2e: error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    shutdown.install()  # a signal to the bench stops every process it started

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", file=sys.stderr, flush=True)

    done: list[Any] = []

    def on_run(run: Any) -> None:  # --out: the figures so far, after every case
        done.append(run)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            partial = result_of(done, config.log_dir or "")
            (args.out / "e2e.json").write_text(to_json(partial, indent=2) + "\n")

    try:
        raw = run_e2e(config, progress, on_run)
    except (ProcessError, RuntimeError) as exc:
        print(f"moriio bench --e2e: failed: {exc}", file=sys.stderr)
        return 1
    result = result_of(raw["runs"], raw["log_dir"], raw)
    result["first_token_ahead"] = config.first_token_ahead
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "e2e.json").write_text(to_json(result, indent=2) + "\n")
        plot_e2e(result["rows"], args.out / E2E_PNG)
        print(f"wrote {args.out / 'e2e.json'}, {args.out / E2E_PNG}", file=sys.stderr)
        if result.get("sweep") and plot_sweep(result["sweep"], args.out / SWEEP_PNG):
            print(f"wrote {args.out / SWEEP_PNG}", file=sys.stderr)
    if args.json:
        print(to_json(result))
    else:
        print(render_table(result["rows"]) + "\n\n" + render_verdicts(result["verdicts"]))
        if config.first_token_ahead:
            print("every P/D router sent the prefill's first token ahead (--first-token-ahead)")
        if result.get("sweep"):
            print("\n" + render_sweep(result["sweep"], config.sweep.goodput))
        if result.get("explained"):
            print("\n" + render_explained(result["explained"]))
    all_equal = all(r["equal"] == r["requests"] for r in result["rows"])
    return 0 if all_equal else 1
