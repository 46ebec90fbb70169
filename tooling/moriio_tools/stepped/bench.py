"""``moriio bench --stepped``: rounds over the connectors, each on a fresh stepped pair.

One plain engine (no connector, both cores: colocated serving) first answers every case at its
concurrency: the reference answers and the ``baseline`` rows. Then, per round, in an order
rotated by one each round, every connector gets a fresh pair
(:class:`moriio_tools.stepped.pair.SteppedPair`), one warm-up request, then each case.
Per connector and case the summary gives the median over the rounds of requests/s and TTFT
p50, with the answers equal to the reference summed; each case's verdict sets moriio's
better mode (by requests/s) against NixlConnector with its progress thread off, and its TTFT
p50 against the baseline's.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moriio_tools.engines.protocol import Submit
from moriio_tools.serve.e2e import case_prompts
from moriio_tools.serve.e2e_report import CASES, summed_sources
from moriio_tools.serve.nixl_deployment import nixl_transfer_config
from moriio_tools.serve.processes import engine_cpu_binds
from moriio_tools.serve.runner import ServeDemoConfig, prepare_model
from moriio_tools.stepped.pair import (
    STEPPED_CONNECTORS,
    EngineLink,
    SteppedCase,
    SteppedPair,
    SteppedRun,
    run_case,
    stepped_engine,
)

PEER = "nixl-progress-off"
PEER_SETTINGS = f"kv_connector_extra_config {nixl_transfer_config()['kv_connector_extra_config']}"
BASELINE = "baseline"
PREFILL_ALONE = "prefill-alone"
CASE_NAMES = ("short-1", "short-4", "long-4", "mixed-128")
DEFAULT_CASES = CASE_NAMES[:3]  # the demo's short prompts, 1 then 4 in flight; 1,000 tokens
LIMITED_CASES = ("mixed-128",)  # prefill-bound: measured against one prefill engine alone
WARMUP_PROMPT = tuple(range(10, 74))  # in no case: the decode's prefix cache never hits it


@dataclass(frozen=True, slots=True)
class SteppedConfig:
    connectors: tuple[str, ...] = STEPPED_CONNECTORS
    cases: tuple[str, ...] = DEFAULT_CASES
    requests: int = 16
    rounds: int = 2
    max_tokens: int = 16
    seed: int = 0
    start_timeout_s: float = 600.0
    idle_timeout_s: float = 60.0  # no message from either engine: the case ends
    log_dir: str | None = None

    def __post_init__(self) -> None:
        unknown = [c for c in self.connectors if c not in STEPPED_CONNECTORS]
        if unknown:
            raise ValueError(
                f"connectors must be of {', '.join(STEPPED_CONNECTORS)}, got {unknown}"
            )
        odd = [c for c in self.cases if c not in CASE_NAMES]
        if odd or not self.cases:
            raise ValueError(f"cases must be of {', '.join(CASE_NAMES)}, got {list(self.cases)}")
        if self.requests < 1 or self.rounds < 1:
            raise ValueError("requests and rounds must be >= 1")


def stepped_cases(config: SteppedConfig) -> list[SteppedCase]:
    chosen = [c for c in CASES if c.name in config.cases]
    return [
        SteppedCase(c.name, tuple(case_prompts(c, config.requests, config.seed)), c.concurrency)
        for c in chosen
    ]


def answer_all(
    engine: EngineLink, label: str, case: SteppedCase, max_tokens: int, timeout: float
) -> tuple[list[tuple[int, ...]], SteppedRun]:
    """``case``'s prompts through one plain engine, ``case.concurrency`` in flight: the
    answers in prompt order, and the run (``label``; every answer counted equal)."""
    answers: dict[int, tuple[int, ...]] = {}
    submitted: dict[str, float] = {}
    ttfts: list[float] = []
    queue = list(enumerate(case.prompts))
    started = ended = time.time()
    while len(answers) < len(case.prompts):
        while queue and len(queue) + len(answers) > len(case.prompts) - case.concurrency:
            index, prompt = queue.pop(0)
            rid = f"{case.name}-{index}"
            submitted[rid] = time.time()
            engine.submit([Submit(rid, tuple(prompt), max_tokens)])
        if not engine.connection.poll(timeout):
            raise TimeoutError(f"{engine.name} stalled on {case.name}")
        engine.pump()
        ttfts += [t.wall_time - submitted[t.key] for t in engine.take_first_tokens()]
        for done in engine.take_finished():
            answers[int(done.key.rsplit("-", 1)[1])] = done.token_ids
            ended = max(ended, done.wall_time)
    count = len(case.prompts)
    run = SteppedRun(label, case.name, 0, count, count, 0, ended - started, None, ttfts)
    return [answers[i] for i in range(count)], run


def plain_engine(
    model: Path, log_dir: Path, cases: Sequence[SteppedCase], config: SteppedConfig
) -> tuple[dict[str, list[tuple[int, ...]]], list[SteppedRun]]:
    """One plain engine on both cores, after a warm-up request, answers every case at its
    concurrency: the reference answers, and the ``baseline`` runs (colocated serving)."""
    engine = stepped_engine(BASELINE, model, log_dir, None, cores=engine_cpu_binds(1)[0])
    try:
        engine.start(config.start_timeout_s)
        warmup = SteppedCase("warmup", (WARMUP_PROMPT,), 1)
        answer_all(engine, BASELINE, warmup, config.max_tokens, config.idle_timeout_s)
        reference: dict[str, list[tuple[int, ...]]] = {}
        runs: list[SteppedRun] = []
        for case in cases:
            answers, run = answer_all(
                engine, BASELINE, case, config.max_tokens, config.idle_timeout_s
            )
            reference[case.name] = answers
            runs.append(run)
        return reference, runs
    finally:
        engine.stop()


def prefill_alone(
    model: Path,
    log_dir: Path,
    case: SteppedCase,
    reference: Sequence[tuple[int, ...]],
    config: SteppedConfig,
) -> SteppedRun:
    """The prefill-bound limit: one plain engine on a prefill's core answers ``case`` with
    ``max_tokens`` 1 (its first tokens checked against the reference's)."""
    core = engine_cpu_binds(2)[0]
    engine = stepped_engine(PREFILL_ALONE, model, log_dir, None, cores=core)
    try:
        engine.start(config.start_timeout_s)
        answers, run = answer_all(engine, PREFILL_ALONE, case, 1, config.idle_timeout_s)
    finally:
        engine.stop()
    run.equal = sum(1 for got, want in zip(answers, reference, strict=True) if got == want[:1])
    run.ttft_s = []  # one token each: its TTFT is its whole answer
    return run


def run_stepped(config: SteppedConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    root = Path(config.log_dir or tempfile.mkdtemp(prefix="moriio-stepped-"))
    model = prepare_model(ServeDemoConfig())
    cases = stepped_cases(config)
    began = time.monotonic()

    def say(text: str) -> None:
        progress(f"[{time.monotonic() - began:6.1f} s] {text}")

    say(f"{BASELINE}: one plain engine on both cores, the reference answers")
    reference, runs = plain_engine(model, root, cases, config)
    for run in runs:
        say(f"  {run.case}: {render_run(run)}")
    for case in (c for c in cases if c.name in LIMITED_CASES):
        say(f"{PREFILL_ALONE}: one plain engine on a prefill's core, max_tokens 1")
        runs.append(prefill_alone(model, root, case, reference[case.name], config))
    names = list(config.connectors)
    for round_index in range(config.rounds):
        turn = round_index % len(names)
        for connector in names[turn:] + names[:turn]:
            say(f"round {round_index + 1}/{config.rounds}: {connector}")
            log_dir = root / f"round{round_index}" / connector
            pair = SteppedPair(connector, model, log_dir, config.start_timeout_s)
            try:
                warmup = SteppedCase("warmup", (WARMUP_PROMPT,), 1)
                run_case(pair, warmup, config.max_tokens, None, round_index, config.idle_timeout_s)
                for case in cases:
                    run, _ = run_case(
                        pair,
                        case,
                        config.max_tokens,
                        reference[case.name],
                        round_index,
                        config.idle_timeout_s,
                    )
                    runs.append(run)
                    say(f"  {case.name}: {render_run(run)}")
            finally:
                pair.close()
    return {
        "config": asdict(config),
        "log_dir": str(root),
        "runs": [asdict(r) | {"requests_per_s": r.requests_per_s} for r in runs],
        "summary": summarize(runs),
    }


def render_run(run: SteppedRun) -> str:
    ttft = run.ttft_p50_ms
    loaded = "" if run.connector in (BASELINE, PREFILL_ALONE) else f", {run.loaded} loaded"
    return (
        f"{run.equal}/{run.requests} equal{loaded}, {run.requests_per_s:.2f} req/s, TTFT p50 "
        + ("-" if ttft is None else f"{ttft:.0f} ms")
    )


def summarize(runs: Sequence[SteppedRun]) -> dict[str, Any]:
    """Per case: each connector's medians over the rounds, then moriio's better mode
    against the peer (ratios: requests/s moriio/peer, TTFT p50 moriio/peer)."""
    out: dict[str, Any] = {}
    for case in dict.fromkeys(r.case for r in runs):
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
            }
        limit = rows.get(PREFILL_ALONE)
        for row in rows.values():
            row["vs_prefill_alone"] = (
                None if limit is None else _ratio(row["requests_per_s"], limit["requests_per_s"])
            )
        moriio = [c for c in rows if c.startswith("moriio")]
        verdict: dict[str, Any] = {}
        if moriio and PEER in rows:
            best = max(moriio, key=lambda c: rows[c]["requests_per_s"])
            peer, ours = rows[PEER], rows[best]
            verdict = {
                "best": best,
                "requests_per_s_ratio": _ratio(ours["requests_per_s"], peer["requests_per_s"]),
                "ttft_p50_ratio": _ratio(ours["ttft_p50_ms"], peer["ttft_p50_ms"]),
            }
        if moriio and BASELINE in rows:
            best = verdict.get("best") or max(moriio, key=lambda c: rows[c]["requests_per_s"])
            ours_ms, single_ms = rows[best]["ttft_p50_ms"], rows[BASELINE]["ttft_p50_ms"]
            verdict["best"] = best
            verdict["ttft_over_baseline_ms"] = (
                None if ours_ms is None or single_ms is None else ours_ms - single_ms
            )
        out[case] = {"connectors": rows, "verdict": verdict}
    return out


def _median(values: Iterable[float | None]) -> float | None:
    """The median of the rounds' figures that exist; None when none does."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or not theirs else ours / theirs


def render_stepped(result: dict[str, Any]) -> str:
    lines = [
        f"peer: NixlConnector at vLLM's defaults ({PEER_SETTINGS}), its progress thread off: "
        "a stepped engine's steps progress its transfers",
        "TTFT = prefill (submission -> the prefill engine finished) + hand-off (-> the decode's"
        " first token), p50s in ms",
        "case       connector           equal  loaded     req/s  TTFT p50  prefill  hand-off"
        "  failures  x limit",
    ]
    for case, entry in result["summary"].items():
        for connector, row in entry["connectors"].items():
            vs = row.get("vs_prefill_alone")
            lines.append(
                f"{case:<10} {connector:<18} {row['equal']:>3}/{row['requests']:<4} "
                f"{row['loaded']:>6} {row['requests_per_s']:>9.2f}"
                f"  {_ms(row['ttft_p50_ms']):>8}  {_ms(row.get('prefill_p50_ms')):>7}"
                f"  {_ms(row.get('handoff_p50_ms')):>8}"
                f"  {row['failures']:>8}"
                f"  {'-' if vs is None or connector == PREFILL_ALONE else f'{vs:.2f}':>7}"
            )
        verdict = entry["verdict"]
        if "requests_per_s_ratio" in verdict:
            rps, ttft = verdict["requests_per_s_ratio"], verdict["ttft_p50_ratio"]
            lines.append(
                f"{case:<10} {verdict['best']} vs {PEER}: req/s x"
                + ("-" if rps is None else f"{rps:.2f}")
                + ", TTFT p50 x"
                + ("-" if ttft is None else f"{ttft:.2f}")
            )
        over = verdict.get("ttft_over_baseline_ms")
        if over is not None:
            lines.append(f"{case:<10} {verdict['best']}: TTFT p50 {over:+.0f} ms over {BASELINE}")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
