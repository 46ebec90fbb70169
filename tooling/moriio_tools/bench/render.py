"""Text for the bench sections: each figure next to its reference and target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moriio.output import fmt_bytes, fmt_num, format_table
from moriio_tools.bench.suite import REQUIRED_KEYS


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
    lines.append(
        f"the {n}-layer request as one batch between two buffers (shifted, merged by remote "
        "offset): "
        + ", ".join(
            f"{name} {fmt_num(v.get('request_batch_61_layers_us'), '.0f')} us "
            f"({v.get('request_batch_descriptors')} descriptors)"
            for name, v in p["layouts"].items()
        )
    )
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
