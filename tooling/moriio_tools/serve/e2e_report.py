"""``moriio bench --e2e`` results: per connector and case figures, the table, the plot.

A run is one connector on one case in one round: its completions' TTFTs and inter-token
gaps, its wall time and the engines' CPU time. :func:`aggregate` pools the rounds:

- requests/s counts only the answers equal to the reference (a failed or wrong answer is not
  throughput) and is the median over rounds;
- latency percentiles are over every request of every round;
- CPU per request is the engines' processes' CPU time (user + system, from ``/proc``, every
  process of both engines, inference included) over the requests.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moriio.output import format_table

BASELINE = "baseline"
PREFILL_ALONE = "prefill-alone"  # one plain engine on a prefill's core, max_tokens 1
E2E_PNG = "e2e.png"

CONNECTORS = (
    "moriio-read-async",
    "moriio-read-layerwise",
    "moriio-write",
    "nixl-default",
    "nixl-progress-off",
    "mooncake",
)
# Run unless --connectors says otherwise; mooncake needs its transfer engine and libibverbs.
DEFAULT_CONNECTORS = CONNECTORS[:-1]
PEERS = ("nixl", "mooncake")  # vLLM's connectors, by name prefix


@dataclass(frozen=True, slots=True)
class Case:
    """``prompt_len`` None: random lengths in ``lengths`` (None: the demo's short range);
    ``requests`` None: the run's ``--requests``."""

    name: str
    concurrency: int
    prompt_len: int | None
    lengths: tuple[int, int] | None = None
    requests: int | None = None


CASES = (
    Case("short-1", 1, None),
    Case("short-4", 4, None),
    Case("long-4", 4, 1000),
    Case("mixed-128", 128, None, lengths=(20, 600), requests=256),
)
DEFAULT_CASES = tuple(c.name for c in CASES if c.requests is None)  # the rest run when named


@dataclass(slots=True)
class Run:
    connector: str
    case: str
    round: int
    requests: int
    equal: int
    failures: int
    wall_s: float
    cpu_s: float | None
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    engine_itl_s: float | None = None  # the decode engines' own ITL p50 (their /metrics)
    prompt_tokens: int = 0  # the tokens of the prompts sent
    # The decode engines' prompt tokens per source (vLLM's prefill stats): loaded over the
    # wire, found in their prefix cache, computed.
    prompt_sources: dict[str, int] = field(default_factory=dict)

    @property
    def requests_per_s(self) -> float:
        """Requests answered with the reference's output, per second of the run."""
        return self.equal / self.wall_s if self.wall_s > 0 else 0.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile, ``q`` in [0, 1]; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(1e3 * value, 2)


def aggregate(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per (connector, case), in the order they first appear."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.connector, run.case), []).append(run)
    rows = []
    for (connector, case), group in groups.items():
        rates = [r.requests_per_s for r in group if r.wall_s > 0]
        ttft = [t for r in group for t in r.ttft_s]
        itl = [t for r in group for t in r.itl_s]
        requests = sum(r.requests for r in group)
        cpu = [r.cpu_s for r in group if r.cpu_s is not None]
        cpu_requests = sum(r.requests for r in group if r.cpu_s is not None)
        engine_itl = [r.engine_itl_s for r in group if r.engine_itl_s is not None]
        rows.append(
            {
                "connector": connector,
                "case": case,
                "rounds": len(group),
                "requests": requests,
                "equal": sum(r.equal for r in group),
                "failures": sum(r.failures for r in group),
                "requests_per_s": round(statistics.median(rates), 2) if rates else None,
                "requests_per_s_rounds": [round(x, 2) for x in rates],
                "ttft_ms_p50": _ms(percentile(ttft, 0.5)),
                "ttft_ms_p99": _ms(percentile(ttft, 0.99)),
                "itl_ms_p50": _ms(percentile(itl, 0.5)),
                "itl_ms_p99": _ms(percentile(itl, 0.99)),
                "engine_itl_ms_p50": _ms(statistics.median(engine_itl)) if engine_itl else None,
                "engine_cpu_ms_per_request": (
                    round(1e3 * sum(cpu) / cpu_requests, 1) if cpu_requests else None
                ),
                "prompt_tokens": sum(r.prompt_tokens for r in group),
                "prompt_sources": summed_sources(group),
            }
        )
    return rows


def summed_sources(runs: Sequence[Run]) -> dict[str, int]:
    """The runs' prompt tokens per source, summed (every source any run names kept)."""
    out: dict[str, int] = {}
    for run in runs:
        for source, tokens in run.prompt_sources.items():
            out[source] = out.get(source, 0) + tokens
    return out


def with_prefill_limit(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each P/D row with ``vs_prefill_alone``: its req/s over what one prefill engine alone
    sustains on its core for the same prompts (the bound of a prefill-bound workload)."""
    limits = {
        r["case"]: r["requests_per_s"]
        for r in rows
        if r["connector"] == PREFILL_ALONE and r["requests_per_s"]
    }
    out = []
    for row in rows:
        limit = limits.get(row["case"])
        pd_row = row["connector"] not in (BASELINE, PREFILL_ALONE)
        ratio = None
        if pd_row and limit and row["requests_per_s"] is not None:
            ratio = round(row["requests_per_s"] / limit, 2)
        out.append({**row, "vs_prefill_alone": ratio})
    return out


def _best(rows: Sequence[dict[str, Any]], key: str, prefix: str, low: bool) -> dict[str, Any]:
    mine = [r for r in rows if r["connector"].startswith(prefix) and r[key] is not None]
    if not mine:
        return {}
    pick = min(mine, key=lambda r: r[key]) if low else max(mine, key=lambda r: r[key])
    return {"connector": pick["connector"], key: pick[key]}


def verdicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case: moriio's best mode against each peer's best (NixlConnector's, Mooncake's),
    requests/s and TTFT p50; ``moriio_wins``: ahead of every peer that has a figure."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        here = [r for r in rows if r["case"] == case]
        verdict: dict[str, Any] = {"case": case}
        for key, low in (("requests_per_s", False), ("ttft_ms_p50", True)):
            ours = _best(here, key, "moriio", low)
            entry: dict[str, Any] = {"moriio": ours}
            wins = []
            for peer in PEERS:
                theirs = _best(here, key, peer, low)
                entry[peer] = theirs
                if ours and theirs:
                    a, b = ours[key], theirs[key]
                    wins.append(a <= b if low else a >= b)
            if wins:
                entry["moriio_wins"] = all(wins)
            verdict[key] = entry
        out.append(verdict)
    return out


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    headers = (
        "case",
        "connector",
        "equal",
        "req/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "engine ITL p50",
        "engine CPU/req",
        "x prefill-alone",
    )
    cases = list(dict.fromkeys(r["case"] for r in rows))
    body = [
        (
            r["case"],
            r["connector"],
            f"{r['equal']}/{r['requests']}",
            _cell(r["requests_per_s"]),
            _cell(r["ttft_ms_p50"]),
            _cell(r["ttft_ms_p99"]),
            _cell(r["itl_ms_p50"]),
            _cell(r["itl_ms_p99"]),
            _cell(r.get("engine_itl_ms_p50")),
            _cell(r["engine_cpu_ms_per_request"]),
            _cell(r.get("vs_prefill_alone")),
        )
        for r in sorted(rows, key=lambda r: cases.index(r["case"]))
    ]
    note = (
        "times in ms; req/s: median over rounds; engine ITL: the decode engine's own "
        "vllm:inter_token_latency_seconds p50 (median over rounds); engine CPU/req: CPU time "
        "of every process of both engines (/proc, inference included) per request; "
        "x prefill-alone: req/s "
        "over one prefill engine alone on its core (max_tokens 1), a prefill-bound case's bound"
    )
    return format_table(headers, body, right=range(2, 11)) + "\n" + note


def render_verdicts(items: Sequence[dict[str, Any]]) -> str:
    lines = []
    for v in items:
        parts = []
        for key, label in (("requests_per_s", "req/s"), ("ttft_ms_p50", "TTFT p50")):
            m = v[key]["moriio"]
            for peer in PEERS:
                n = v[key].get(peer)
                if not m or not n:
                    continue
                a, b = m[key], n[key]
                ahead = a <= b if key == "ttft_ms_p50" else a >= b
                won = "moriio ahead" if ahead else f"{n['connector']} ahead"
                parts.append(f"{label} {a} ({m['connector']}) vs {b} ({n['connector']}): {won}")
        lines.append(f"{v['case']}: " + ("; ".join(parts) or "no comparison"))
    return "\n".join(lines)


def plot_e2e(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    """Requests/s and TTFT p50 per case, one bar per connector."""
    if not rows:
        return False
    from moriio_tools.bench.plot import pyplot, save_figure

    plt = pyplot()
    cases = list(dict.fromkeys(r["case"] for r in rows))
    connectors = list(dict.fromkeys(r["connector"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(connectors)
    for ax, key, label in (
        (axes[0], "requests_per_s", "requests/s (higher is better)"),
        (axes[1], "ttft_ms_p50", "TTFT p50, ms (lower is better)"),
    ):
        for i, name in enumerate(connectors):
            values = [
                next((r[key] or 0 for r in rows if r["case"] == c and r["connector"] == name), 0)
                for c in cases
            ]
            xs = [j + (i - (len(connectors) - 1) / 2) * width for j in range(len(cases))]
            ax.bar(xs, values, width, label=name)
        ax.set_xticks(range(len(cases)), cases)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    save_figure(fig, path, "1P1D end to end: moriio vs vLLM's NixlConnector and MooncakeConnector")
    return True
