"""``moriio bench --stepped``'s summary and its tables: one per binding configuration.

Per binding, case and connector: the medians over the rounds of requests/s, TTFT p50 (split
into prefill and hand-off) and each engine's CPU and wake-ups per second while the case ran,
the answers equal to the reference summed; then moriio's better mode (by requests/s) against
NixlConnector with its progress thread off, and its TTFT p50 over the plain engine's. Per
binding also what each connector's engines cost while idle, their peers connected.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from moriio_tools.serve.e2e_report import summed_sources
from moriio_tools.serve.nixl_deployment import nixl_transfer_config
from moriio_tools.stepped.bindings import BINDINGS
from moriio_tools.stepped.pair import SteppedRun

PEER = "nixl-progress-off"
PEER_SETTINGS = f"kv_connector_extra_config {nixl_transfer_config()['kv_connector_extra_config']}"
BASELINE = "baseline"
PREFILL_ALONE = "prefill-alone"
REFERENCES = (BASELINE, PREFILL_ALONE)  # measured once, shown in every binding's table
ROLES = ("prefill", "decode")


def summarize(runs: Sequence[SteppedRun], idle: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Per binding: per case each connector's medians over the rounds and moriio's verdict
    against the peer; and the idle figures measured in that binding."""
    references = [r for r in runs if r.connector in REFERENCES]
    out: dict[str, Any] = {}
    for binding in dict.fromkeys(r.binding for r in runs if r.connector not in REFERENCES):
        mine = [r for r in runs if r.binding == binding and r.connector not in REFERENCES]
        cases = {
            case: _case([*references, *mine], case) for case in dict.fromkeys(r.case for r in mine)
        }
        out[binding] = {
            "cases": cases,
            "idle": [entry for entry in idle if entry["binding"] == binding],
        }
    return out


def _case(runs: Sequence[SteppedRun], case: str) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for connector in dict.fromkeys(r.connector for r in runs if r.case == case):
        mine = [r for r in runs if r.case == case and r.connector == connector]
        rows[connector] = {
            "requests_per_s": statistics.median(r.requests_per_s for r in mine),
            "ttft_p50_ms": _median(r.ttft_p50_ms for r in mine),
            "prefill_p50_ms": _median(r.prefill_p50_ms for r in mine),
            "handoff_p50_ms": _median(r.handoff_p50_ms for r in mine),
            "equal": sum(r.equal for r in mine),
            "loaded": sum(r.loaded for r in mine),
            "prompt_tokens": sum(r.prompt_tokens for r in mine),
            "prompt_sources": summed_sources(mine),
            "requests": sum(r.requests for r in mine),
            "failures": sum(r.failures for r in mine),
            "usage": {
                role: {
                    key: _median(r.usage[role].get(key) for r in mine if role in r.usage)
                    for key in ("cpu", "wakeups_per_s", "preempted_per_s", "wait")
                }
                for role in ROLES
                if any(role in r.usage for r in mine)
            },
        }
    limit = rows.get(PREFILL_ALONE)
    for row in rows.values():
        row["vs_prefill_alone"] = (
            None if limit is None else _ratio(row["requests_per_s"], limit["requests_per_s"])
        )
    return {"connectors": rows, "verdict": verdict(rows)}


def verdict(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """moriio's better mode (by requests/s) against the peer, and over the plain engine."""
    moriio = [c for c in rows if c.startswith("moriio")]
    if not moriio:
        return {}
    best = max(moriio, key=lambda c: rows[c]["requests_per_s"])
    out: dict[str, Any] = {"best": best}
    if PEER in rows:
        peer, ours = rows[PEER], rows[best]
        out["requests_per_s_ratio"] = _ratio(ours["requests_per_s"], peer["requests_per_s"])
        out["ttft_p50_ratio"] = _ratio(ours["ttft_p50_ms"], peer["ttft_p50_ms"])
    if BASELINE in rows:
        ours_ms, single_ms = rows[best]["ttft_p50_ms"], rows[BASELINE]["ttft_p50_ms"]
        out["ttft_over_baseline_ms"] = (
            None if ours_ms is None or single_ms is None else ours_ms - single_ms
        )
    return out


def _median(values: Iterable[float | None]) -> float | None:
    """The median of the rounds' figures that exist; None when none does."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or not theirs else ours / theirs


def render_stepped(result: dict[str, Any]) -> str:
    lines = [
        f"peer: NixlConnector at vLLM's defaults ({PEER_SETTINGS}), its progress thread off; "
        "every engine stepped as vLLM's engine core steps it",
        "TTFT = prefill (submission -> the prefill engine finished) + hand-off (-> the decode's"
        " first token), p50s in ms; CPU (cores busy) and wake-ups/s of the prefill + decode "
        "engine processes while the case ran",
    ]
    inherited = result.get("inherited_env") or {}
    if inherited:
        lines.append(f"every engine inherits {inherited}")
    for binding, entry in result["summary"].items():
        known = BINDINGS.get(binding)
        lines += ["", f"== {binding}: {known.header if known else binding} =="]
        lines.append(
            "case       connector           equal  loaded     req/s  TTFT p50  prefill  hand-off"
            "   CPU P+D  wake/s P+D  failures  x limit"
        )
        for case, figures in entry["cases"].items():
            lines += _case_lines(case, figures)
        lines += _idle_lines(entry["idle"])
    return "\n".join(lines)


def _case_lines(case: str, entry: dict[str, Any]) -> list[str]:
    lines = []
    for connector, row in entry["connectors"].items():
        vs = row.get("vs_prefill_alone")
        usage = row.get("usage") or {}
        cpu = _sum(u.get("cpu") for u in usage.values())
        wakes = _sum(u.get("wakeups_per_s") for u in usage.values())
        lines.append(
            f"{case:<10} {connector:<18} {row['equal']:>3}/{row['requests']:<4} "
            f"{row['loaded']:>6} {row['requests_per_s']:>9.2f}"
            f"  {_ms(row['ttft_p50_ms']):>8}  {_ms(row.get('prefill_p50_ms')):>7}"
            f"  {_ms(row.get('handoff_p50_ms')):>8}"
            f"  {'-' if cpu is None else f'{cpu:.2f}':>8}"
            f"  {'-' if wakes is None else f'{wakes:.0f}':>10}"
            f"  {row['failures']:>8}"
            f"  {'-' if vs is None or connector == PREFILL_ALONE else f'{vs:.2f}':>7}"
        )
    result = entry["verdict"]
    if "requests_per_s_ratio" in result:
        rps, ttft = result["requests_per_s_ratio"], result["ttft_p50_ratio"]
        lines.append(
            f"{case:<10} {result['best']} vs {PEER}: req/s x"
            + ("-" if rps is None else f"{rps:.2f}")
            + ", TTFT p50 x"
            + ("-" if ttft is None else f"{ttft:.2f}")
        )
    over = result.get("ttft_over_baseline_ms")
    if over is not None:
        lines.append(f"{case:<10} {result['best']}: TTFT p50 {over:+.0f} ms over {BASELINE}")
    return lines


def _idle_lines(idle: Sequence[dict[str, Any]]) -> list[str]:
    if not idle:
        return []
    seconds = idle[0]["engines"]["prefill"]["seconds"]
    lines = [
        f"idle {seconds:.0f} s, peers connected, no request: per engine (prefill / decode) "
        "CPU cores, wake-ups/s; the threads that woke most"
    ]
    for entry in idle:
        engines = entry["engines"]
        cpu = " / ".join(f"{engines[r]['cpu']:.4f}" for r in ROLES)
        wakes = " / ".join(f"{engines[r]['wakeups_per_s']:.1f}" for r in ROLES)
        lines.append(f"  {entry['connector']:<18} CPU {cpu}, wake-ups/s {wakes}")
        for role in ROLES:
            top = sorted(engines[role]["threads"], key=lambda t: -t["wakeups_per_s"])[:5]
            named = ", ".join(
                f"{t['name']}{'' if t['count'] == 1 else ' x' + str(t['count'])} "
                f"{t['wakeups_per_s']:.1f}/s"
                for t in top
                if t["wakeups_per_s"] >= 0.05
            )
            lines.append(f"  {'':<18}   {role}: {named or '-'}")
    return lines


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
