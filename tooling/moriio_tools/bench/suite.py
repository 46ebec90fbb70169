"""Run the bench sections and write their results; each section is measured in isolation."""

from __future__ import annotations

import os
import platform
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moriio.output import to_json

SECTIONS = ("planner", "transport", "scheduler")
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "planner": (
        "us_per_plan",
        "vllm_us_per_plan",
        "speedup_vs_vllm",
        "request_61_layers_us",
        "vllm_request_61_layers_us",
    ),
    "transport": ("gbps", "memcpy_gbps", "ratio"),
    "scheduler": ("us_per_step", "vllm_us_per_step", "ratio"),
}
JSON_NAME = "bench.json"


def failed_section(section: str, reason: str) -> dict[str, Any]:
    """A section whose measurement raised: every required figure null with the reason."""
    result: dict[str, Any] = {}
    for key in REQUIRED_KEYS[section]:
        result[key] = None
        result[f"{key}_reason"] = reason
    return result


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """How to measure: timing rounds, the vLLM references, the NIXL target's process."""

    repeat: int = 5
    use_vllm: bool = True
    two_processes: bool = True
    quick: bool = False  # small sizes, one round: a smoke test, figures not comparable


def measure_section(section: str, options: BenchOptions) -> dict[str, Any]:
    """One section's figures (raises when the section cannot be measured)."""
    use_vllm = options.use_vllm
    if section == "planner":
        from moriio_tools.bench.planner import measure_planner

        if options.quick:
            return measure_planner(
                num_ids=256, num_blocks=1024, repeat=1, use_vllm=use_vllm, round_s=0.001
            )
        return measure_planner(repeat=options.repeat, use_vllm=use_vllm)
    if section == "transport":
        from moriio_tools.bench.transport import measure_transport

        if options.quick:
            return measure_transport(
                num_blocks=64,
                repeats=1,
                latency_iterations=20,
                sweep_sizes=(4096, 65536),
                sweep_total_bytes=1 << 20,
                two_processes=options.two_processes,
            )
        return measure_transport(two_processes=options.two_processes)
    from moriio_tools.bench.scheduler import measure_scheduler

    if options.quick:
        return measure_scheduler(live=64, steps=5, use_vllm=use_vllm)
    return measure_scheduler(use_vllm=use_vllm)


def run_sections(
    sections: tuple[str, ...],
    options: BenchOptions,
    *,
    on_section: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Measure ``sections`` in order; a section that raises is reported, not fatal."""
    result: dict[str, Any] = {
        "moriio_version": _version(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }
    for section in sections:
        try:
            data = measure_section(section, options)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            data = failed_section(section, f"{type(exc).__name__}: {exc}")
        result[section] = data
        if on_section is not None:
            on_section(section, data)
    return result


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("moriio")
    except PackageNotFoundError:
        return "unknown"


def write_outputs(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """``bench.json`` plus the plots (skipped, with a note, without matplotlib)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / JSON_NAME
    json_path.write_text(to_json(result, indent=1) + "\n")
    written = [json_path]
    from moriio_tools.bench.plot import PLOT_EXTRA, write_plots

    try:
        written += write_plots(result, out_dir)
    except ImportError as exc:
        print(f"moriio bench: no plots ({exc}); {PLOT_EXTRA}", file=sys.stderr)
    return written
