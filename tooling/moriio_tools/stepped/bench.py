"""``moriio bench --stepped``: rounds over the bindings and connectors, each on a fresh pair.

One plain engine (no connector, vLLM's defaults: both cores) first answers every case at its
concurrency: the reference answers and the ``baseline`` rows. Then, per round, for every
binding configuration (:mod:`moriio_tools.stepped.bindings`), every connector, in an order
rotated by one each round, gets a fresh pair
(:class:`moriio_tools.stepped.pair.SteppedPair`), one warm-up request, in the first round an
idle phase (its peers connected, no request: what the engines cost while nothing moves),
then each case, with each engine's CPU and wake-ups measured around it
(:mod:`moriio_tools.stepped.usage`). :mod:`moriio_tools.stepped.report` sums it up per
binding.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moriio_tools.engines.protocol import Submit
from moriio_tools.serve.e2e import case_prompts
from moriio_tools.serve.e2e_report import CASES
from moriio_tools.serve.processes import engine_cpu_binds
from moriio_tools.serve.runner import ServeDemoConfig, prepare_model
from moriio_tools.stepped.bindings import BINDINGS, DEFAULT_BINDINGS, inherited
from moriio_tools.stepped.pair import (
    STEPPED_CONNECTORS,
    EngineLink,
    SteppedCase,
    SteppedPair,
    SteppedRun,
    run_case,
    stepped_engine,
)
from moriio_tools.stepped.report import (
    BASELINE,
    PEER,
    PREFILL_ALONE,
    REFERENCES,
    render_stepped,
    summarize,
)
from moriio_tools.stepped.usage import PairUsage

__all__ = ["BASELINE", "PEER", "SteppedConfig", "render_stepped", "run_stepped"]

CASE_NAMES = ("short-1", "short-4", "long-4", "mixed-128")
DEFAULT_CASES = ("short-4", "long-4")  # the demo's short prompts and 1,000 tokens, 4 in flight
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
    bindings: tuple[str, ...] = DEFAULT_BINDINGS
    idle_s: float = 30.0  # first round: each pair idle this long, peers connected (0: skip)
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
        odd = [b for b in self.bindings if b not in BINDINGS]
        if odd or not self.bindings:
            raise ValueError(f"bindings must be of {', '.join(BINDINGS)}, got {odd}")
        if not self.idle_s >= 0:
            raise ValueError(f"idle_s must be >= 0, got {self.idle_s}")


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
    """One plain engine at vLLM's defaults (unbound: both cores), after a warm-up request,
    answers every case at its concurrency: the reference answers, and the ``baseline`` runs
    (colocated serving)."""
    engine = stepped_engine(BASELINE, model, log_dir, None, cores="nobind")
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

    say(f"{BASELINE}: one plain engine at vLLM's defaults, the reference answers")
    reference, runs = plain_engine(model, root, cases, config)
    for run in runs:
        say(f"  {run.case}: {render_run(run)}")
    for case in (c for c in cases if c.name in LIMITED_CASES):
        say(f"{PREFILL_ALONE}: one plain engine on a prefill's core, max_tokens 1")
        runs.append(prefill_alone(model, root, case, reference[case.name], config))
    idle: list[dict[str, Any]] = []
    names = list(config.connectors)
    for round_index in range(config.rounds):
        turn = round_index % len(names)
        for binding in config.bindings:
            for connector in names[turn:] + names[:turn]:
                say(f"round {round_index + 1}/{config.rounds}, {binding}: {connector}")
                log_dir = root / f"round{round_index}" / binding / connector
                pair = SteppedPair(
                    connector, model, log_dir, config.start_timeout_s, BINDINGS[binding]
                )
                try:
                    warmup = SteppedCase("warmup", (WARMUP_PROMPT,), 1)
                    run_case(pair, warmup, config.max_tokens, None, round_index, 60.0)
                    if round_index == 0 and config.idle_s > 0:
                        idle.append(idle_phase(pair, binding, config.idle_s))
                        say(f"  idle {config.idle_s:.0f} s: {render_idle(idle[-1])}")
                    for case in cases:
                        run = measured_case(pair, case, reference[case.name], round_index, config)
                        run.binding = binding
                        runs.append(run)
                        say(f"  {case.name}: {render_run(run)}")
                finally:
                    pair.close()
    return {
        "config": asdict(config),
        "log_dir": str(root),
        "inherited_env": inherited(),
        "runs": [asdict(r) | {"requests_per_s": r.requests_per_s} for r in runs],
        "idle": idle,
        "summary": summarize(runs, idle),
    }


def idle_phase(pair: SteppedPair, binding: str, seconds: float) -> dict[str, Any]:
    """What the pair's engines cost over ``seconds`` with no request, peers connected."""
    usage = PairUsage({"prefill": pair.prefill, "decode": pair.decode})
    usage.start()
    time.sleep(seconds)
    engines = usage.stop()
    return {
        "binding": binding,
        "connector": pair.connector,
        "engines": {role: figures.as_dict() for role, figures in engines.items()},
    }


def render_idle(entry: dict[str, Any]) -> str:
    engines = entry["engines"]
    return ", ".join(
        f"{role} {e['cpu']:.4f} cores, {e['wakeups_per_s']:.1f} wake-ups/s"
        for role, e in engines.items()
    )


def measured_case(
    pair: SteppedPair,
    case: SteppedCase,
    reference: Sequence[tuple[int, ...]],
    round_index: int,
    config: SteppedConfig,
) -> SteppedRun:
    """``case`` through ``pair``, with what each engine cost while it ran."""
    usage = PairUsage({"prefill": pair.prefill, "decode": pair.decode})
    usage.start()
    run, _ = run_case(pair, case, config.max_tokens, reference, round_index, config.idle_timeout_s)
    run.usage = {role: figures.figures() for role, figures in usage.stop().items()}
    return run


def render_run(run: SteppedRun) -> str:
    ttft = run.ttft_p50_ms
    loaded = "" if run.connector in REFERENCES else f", {run.loaded} loaded"
    return (
        f"{run.equal}/{run.requests} equal{loaded}, {run.requests_per_s:.2f} req/s, TTFT p50 "
        + ("-" if ttft is None else f"{ttft:.0f} ms")
    )
