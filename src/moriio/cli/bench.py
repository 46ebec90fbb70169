"""``moriio bench``: planner, transport and scheduler figures, each next to its reference.

Every reference is measured in the same run: the planner against vLLM's in-tree MoRIIO offset
computation and a naive loop, NIXL loopback against memcpy, the scheduler side against the
in-tree connector. ``--json`` prints one object with the sections ``planner``,
``transport`` and ``scheduler``; ``--out DIR`` also writes ``bench.json`` and PNG plots there.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moriio.tools.output import fmt_bytes, fmt_num, format_table, stdout_to_stderr, to_json

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--section", choices=(*SECTIONS, "all"), default="all")
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
    parser.add_argument("--workers", type=int, help="--chaos: processes (default: CPU count)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, one round: a smoke test whose figures are not comparable",
    )


def failed_section(section: str, reason: str) -> dict[str, Any]:
    """A section whose measurement raised: every required figure null with the reason."""
    result: dict[str, Any] = {}
    for key in REQUIRED_KEYS[section]:
        result[key] = None
        result[f"{key}_reason"] = reason
    return result


def _measure(section: str, args: argparse.Namespace) -> dict[str, Any]:
    use_vllm = not args.no_vllm
    if section == "planner":
        from moriio.tools.bench.planner import measure_planner

        if args.quick:
            return measure_planner(
                num_ids=256, num_blocks=1024, repeat=1, use_vllm=use_vllm, round_s=0.001
            )
        return measure_planner(repeat=args.repeat, use_vllm=use_vllm)
    if section == "transport":
        from moriio.tools.bench.transport import measure_transport

        if args.quick:
            return measure_transport(
                num_blocks=64,
                repeats=1,
                latency_iterations=20,
                sweep_sizes=(4096, 65536),
                sweep_total_bytes=1 << 20,
                two_processes=not args.one_process,
            )
        return measure_transport(two_processes=not args.one_process)
    from moriio.tools.bench.scheduler import measure_scheduler

    if args.quick:
        return measure_scheduler(live=64, steps=5, use_vllm=use_vllm)
    return measure_scheduler(use_vllm=use_vllm)


def run_sections(
    sections: tuple[str, ...],
    args: argparse.Namespace,
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
            data = _measure(section, args)
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


def _x(value: object) -> str:
    return fmt_num(value, ".1f", "x")


def _reason(section: dict[str, Any], key: str) -> str:
    reason = section.get(f"{key}_reason")
    return f" ({reason})" if reason else ""


def _met(value: float | None, target: float, *, at_most: bool = False) -> str:
    if value is None:
        return "not measured"
    ok = value <= target if at_most else value >= target
    return "met" if ok else "MISSED"


def render_planner(p: dict[str, Any]) -> str:
    if "layouts" not in p:
        return f"planner: not measured{_reason(p, 'us_per_plan')}"
    lines = [
        f"planner: {p['num_ids']} random block ids of {p['num_blocks']}, bf16, Python int lists"
        + (
            f"; in-tree reference: vLLM {p['vllm_version']} {p['vllm_call']}"
            if p.get("vllm_call")
            else f"; in-tree reference not measured{_reason(p, 'vllm_us_per_plan')}"
        )
    ]
    rows = []
    for name, v in p["layouts"].items():
        rows.append(
            [
                name,
                v["descriptors"],
                fmt_num(v["us_per_plan"], ".1f"),
                fmt_num(v["vllm_us_per_plan"], ".0f"),
                fmt_num(v["naive_us_per_plan"], ".0f"),
                _x(v["speedup_vs_vllm"]),
                _x(v["speedup_vs_naive"]),
                fmt_num(v["request_61_layers_us"], ".1f"),
                fmt_num(v["vllm_request_61_layers_us"], ".0f"),
                _x(v["request_61_layers_speedup_vs_vllm"]),
                fmt_num(v["cached_lookup_us"], ".2f"),
            ]
        )
    n = p["num_layers"]
    headers = [
        "layout",
        "descr.",
        "us/plan",
        "in-tree us",
        "naive us",
        "vs in-tree",
        "vs naive",
        f"{n}-layer READ us",
        "in-tree us",
        "vs in-tree",
        "cache hit us",
    ]
    lines.append(format_table(headers, rows, right=tuple(range(1, 11))))
    targets = p["targets"]
    least_request = p["min_request_61_layers_speedup_vs_vllm"]
    lines.append(
        f"targets: >= {targets['speedup_vs_vllm']:g}x vs in-tree per layer "
        f"(least {_x(p['min_speedup_vs_vllm'])}: "
        f"{_met(p['min_speedup_vs_vllm'], targets['speedup_vs_vllm'])}), "
        f">= {targets['request_61_layers_speedup_vs_vllm']:g}x per {n}-layer READ request "
        f"(least {_x(least_request)}: "
        f"{_met(least_request, targets['request_61_layers_speedup_vs_vllm'])})"
    )
    return "\n".join(lines)


def render_transport(t: dict[str, Any]) -> str:
    if t.get("gbps") is None:
        return f"transport: not measured{_reason(t, 'gbps')}"
    mib = fmt_bytes(t["region_bytes"])
    lines = [
        f"transport: NIXL loopback, {t['processes']} process(es), {t['num_blocks']} x "
        f"{fmt_bytes(t['block_size'])} = {mib} per batch, median of {t['repeats']}"
        f"{'' if t.get('verified') else ' (bytes NOT verified)'}"
    ]
    rows = [["np.copyto (reference)", fmt_num(t["memcpy_gbps"], ".2f"), "1.00"]]
    for order in ("sequential", "permuted"):
        for op in ("read", "write"):
            key = f"{op}_{order}"
            rows.append(
                [
                    f"NIXL {op.upper()} {order}",
                    fmt_num(t[f"{key}_gbps"], ".2f"),
                    fmt_num(t[f"{key}_ratio"], ".2f"),
                ]
            )
    lines.append(format_table(["figure", "GB/s", "x memcpy"], rows, right=(1, 2)))
    lat = [
        f"{fmt_bytes(size)} p50 {t[f'latency_{size}_p50_us']:.1f} us, "
        f"p99 {t[f'latency_{size}_p99_us']:.1f} us"
        for size in (4096, 65536)
        if f"latency_{size}_p50_us" in t
    ]
    lines.append("latency READ: " + "; ".join(lat))
    lines.append(
        f"target: >= {t['target_ratio']:g}x memcpy (READ sequential {t['ratio']:.2f}x: "
        f"{_met(t['ratio'], t['target_ratio'])}; permuted {t['permuted_ratio']:.2f}x)"
    )
    sweep = t.get("sweep") or []
    if sweep:
        lines.append(
            f"sweep: READ of {fmt_bytes(t['sweep_total_bytes'])} in permuted blocks, one process"
        )
        rows = [
            [fmt_bytes(r["block_size"]), f"{r['gbps']:.2f}", f"{r['memcpy_gbps']:.2f}"]
            for r in sweep
        ]
        lines.append(format_table(["block", "NIXL GB/s", "gather GB/s"], rows, right=(0, 1, 2)))
    elif t.get("sweep_reason"):
        lines.append(f"sweep: not measured ({t['sweep_reason']})")
    return "\n".join(lines)


def render_scheduler(s: dict[str, Any]) -> str:
    head = f"scheduler: {s.get('live_requests', '?')} live transferring requests"
    per_role: dict[str, dict[str, Any]] = s.get("per_role") or {}
    if per_role:
        rows = [
            [
                role,
                fmt_num(v.get("us_per_step"), ".1f"),
                fmt_num(v.get("vllm_us_per_step"), ".1f"),
                fmt_num(v.get("noop_us_per_step"), ".1f"),
                fmt_num(v.get("ratio"), ".2f"),
            ]
            for role, v in per_role.items()
        ]
        table = format_table(
            ["role", "moriio us/step", "in-tree us/step", "no-op us/step", "ratio"],
            rows,
            right=(1, 2, 3, 4),
        )
        target = s.get("target_ratio", 1.0)
        ratio = s.get("ratio")
        headline = (
            f"headline ({s.get('headline_role', 'worst role')}): moriio "
            f"{fmt_num(s.get('us_per_step'), '.1f')} us/step, in-tree "
            f"{fmt_num(s.get('vllm_us_per_step'), '.1f')}{_reason(s, 'vllm_us_per_step')}, "
            f"ratio {fmt_num(ratio, '.2f')} (target <= {target:g}: "
            f"{_met(ratio, target, at_most=True)})"
        )
        return "\n".join([head, table, headline])
    rows = [
        ["moriio us/step", fmt_num(s.get("us_per_step"), ".1f") + _reason(s, "us_per_step")],
        [
            "in-tree us/step",
            fmt_num(s.get("vllm_us_per_step"), ".1f") + _reason(s, "vllm_us_per_step"),
        ],
        ["ratio (target <= 1)", fmt_num(s.get("ratio"), ".2f") + _reason(s, "ratio")],
    ]
    return head + "\n" + format_table(["figure", "value"], rows)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "planner": render_planner,
    "transport": render_transport,
    "scheduler": render_scheduler,
}


def render_section(section: str, data: dict[str, Any]) -> str:
    """Text for one section; falls back to its nulls and reasons if a figure is missing."""
    try:
        return RENDERERS[section](data)
    except (KeyError, TypeError, ValueError):
        figures = ", ".join(
            f"{k}={fmt_num(data.get(k))}{_reason(data, k)}" for k in REQUIRED_KEYS[section]
        )
        return f"{section}: {figures}"


def write_outputs(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """``bench.json`` plus the plots (skipped, with a note, without matplotlib)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / JSON_NAME
    json_path.write_text(to_json(result, indent=1) + "\n")
    written = [json_path]
    try:
        from moriio.tools.bench.plot import write_plots
    except ImportError as exc:  # pragma: no cover - matplotlib is in the dev extra
        print(f"moriio bench: no plots ({exc})", file=sys.stderr)
        return written
    try:
        written += write_plots(result, out_dir)
    except ImportError as exc:
        print(f"moriio bench: no plots ({exc}); install matplotlib", file=sys.stderr)
    return written


def run_chaos(args: argparse.Namespace) -> int:
    from moriio.tools.bench.chaos import measure_chaos, render_chaos

    data = measure_chaos(seeds=args.seeds, workers=args.workers)
    print(to_json({"chaos": data}) if args.json else render_chaos(data))
    return 1 if data["invariant_violations"] else 0


def run(args: argparse.Namespace) -> int:
    if args.chaos:
        return run_chaos(args)
    sections = SECTIONS if args.section == "all" else (args.section,)
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

    def announce(section: str, data: dict[str, Any]) -> None:
        if not args.json:
            print(render_section(section, data) + "\n", flush=True)

    if args.json:
        with stdout_to_stderr():
            result = run_sections(sections, args)
    else:
        result = run_sections(sections, args, on_section=announce)
    if args.out is not None:
        with stdout_to_stderr():
            paths = write_outputs(result, args.out)
        where = sys.stderr if args.json else sys.stdout
        print("wrote " + ", ".join(str(p) for p in paths), file=where)
    if args.json:
        print(to_json(result))
    return 0
