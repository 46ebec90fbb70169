"""``moriio bench --e2e``: moriio against vLLM's NixlConnector, same deployment, same load.

1. One plain ``vllm serve`` engine runs every case: its greedy outputs are the reference
   every connector's outputs are compared with (token ids), and its figures a single-engine
   row.
2. Rounds: in each, every connector in turn (the order rotates from round to round) gets a
   fresh 1P1D deployment (moriio: ``moriio router`` + the moriio connector, as ``moriio
   demo`` runs it; NixlConnector: :mod:`moriio_tools.serve.nixl_deployment`), one warm-up
   request, then every case, each with its own prompts (no prefix-cache hits):
   ``short-1`` short prompts (33-200 tokens) one at a time, ``short-4`` the same shape 4 in
   flight, ``long-4`` 1,000-token prompts 4 in flight, ``mixed-128`` 256 prompts of 20-600
   tokens 128 in flight (run only when named).

Before the rounds (``prefill_limit``), one plain engine on the core a prefill engine gets
answers every case with ``max_tokens`` 1: what a prefill engine alone sustains, the bound of
a prefill-bound case (its first tokens are checked against the reference's).
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from moriio.timeline import TIMELINE_DIR_ENV, read_events
from moriio_tools.prompts import MAX_RANDOM_LEN, MIN_RANDOM_LEN, TOKEN_LOW, Prompt
from moriio_tools.serve.client import Completion, complete
from moriio_tools.serve.deployment import Deployment
from moriio_tools.serve.e2e_report import (
    BASELINE,
    CASES,
    CONNECTORS,
    DEFAULT_CASES,
    DEFAULT_CONNECTORS,
    PREFILL_ALONE,
    Case,
    Run,
)
from moriio_tools.serve.metrics import (
    ENGINE_ITL,
    histogram_quantile,
    prompt_tokens_by_source,
    scrape,
    since,
)
from moriio_tools.serve.mooncake_deployment import MooncakeDeployment
from moriio_tools.serve.nixl_deployment import NixlDeployment
from moriio_tools.serve.processes import PlainEngine, engine_cpu_binds, session_stats
from moriio_tools.serve.runner import ServeDemoConfig, prepare_model
from moriio_tools.serve.timeline_report import explain, request_times, stages_for
from moriio_tools.serve.vllm_bench import SweepConfig, run_sweep

Progress = Callable[[str], None]

VOCAB = 1000  # the demo model's vocabulary


@dataclass(frozen=True, slots=True)
class E2EConfig:
    connectors: tuple[str, ...] = DEFAULT_CONNECTORS
    cases: tuple[str, ...] = DEFAULT_CASES
    requests: int = 16  # per case and round
    rounds: int = 3
    max_tokens: int = 16
    seed: int = 0
    log_dir: str | None = None
    model_cache_dir: str | None = None
    start_timeout_s: float = 600.0
    request_timeout_s: float = 60.0  # a request not done by then counts as failed
    prefill_limit: bool = True  # measure one prefill engine alone (one more engine start)
    explain: bool = False  # record moriio's timelines; each case's stages in the result
    sweep: SweepConfig | None = None  # also drive every deployment with vllm bench serve
    first_token_ahead: bool = False  # every router streams the prefill's first token at once

    def validate(self) -> None:
        for name in self.connectors:
            if name not in CONNECTORS:
                raise ValueError(f"connector must be one of {', '.join(CONNECTORS)}, got {name!r}")
        known = {c.name for c in CASES}
        for name in self.cases:
            if name not in known:
                raise ValueError(f"case must be one of {', '.join(sorted(known))}, got {name!r}")
        if self.requests < 1 or self.rounds < 1:
            raise ValueError("requests and rounds must be >= 1")
        if not 1 <= self.max_tokens <= 16:
            raise ValueError(f"max_tokens must be in [1, 16], got {self.max_tokens}")
        if self.start_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("start_timeout_s and request_timeout_s must be > 0")
        if self.sweep is not None:
            self.sweep.validate()


def case_prompts(case: Case, requests: int, seed: int) -> list[Prompt]:
    """Distinct prompts of random tokens for ``case`` (seeded per case): its own count, else
    ``requests``."""
    rng = random.Random(f"{seed}:{case.name}")
    low, high = case.lengths or (MIN_RANDOM_LEN, MAX_RANDOM_LEN)
    out: list[Prompt] = []
    while len(out) < (case.requests or requests):
        n = case.prompt_len or rng.randint(low, high)
        prompt = tuple(rng.randrange(TOKEN_LOW, VOCAB) for _ in range(n))
        if prompt not in out:
            out.append(prompt)
    return out


async def run_limited(
    url: str,
    model: str,
    prompts: Sequence[Prompt],
    max_tokens: int,
    concurrency: int,
    timeout_s: float,
    id_prefix: str = "",
) -> list[Completion]:
    """Every prompt, at most ``concurrency`` in flight, each within ``timeout_s``;
    ``id_prefix``: each request's ``X-Request-Id`` is it plus the prompt's index."""
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(index: int, prompt: Prompt) -> Completion:
            async with gate:
                rid = f"{id_prefix}{index}" if id_prefix else ""
                return await complete(session, url, model, index, prompt, max_tokens, rid)

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def sessions_cpu_s(leaders: Sequence[int], proc: Path = Path("/proc")) -> float:
    """User + system CPU seconds of every live process in the sessions led by ``leaders``."""
    stats = session_stats(leaders, proc).values()
    return sum(int(fields[11]) + int(fields[12]) for fields in stats) / _CLOCK_TICKS


class Served(Protocol):
    router_url: str

    def engine_pids(self) -> list[int]: ...

    def decode_urls(self) -> list[str]:
        """The engines that stream the tokens (a plain engine: itself)."""
        ...


def run_case(
    served: Served,
    connector: str,
    case: Case,
    prompts: Sequence[Prompt],
    expected: Sequence[tuple[int, ...]] | None,
    config: E2EConfig,
    model: str,
    round_index: int,
    max_tokens: int | None = None,
) -> tuple[Run, list[Completion]]:
    """One case through ``served`` (``max_tokens`` None: the config's); the run and every
    completion (each request's ``X-Request-Id``: connector.case.round.index)."""
    url = f"{served.router_url}/v1/completions"
    metrics_before = scrape(served.decode_urls())
    cpu_before = sessions_cpu_s(served.engine_pids())
    started = time.perf_counter()
    out = asyncio.run(
        run_limited(
            url,
            model,
            prompts,
            max_tokens or config.max_tokens,
            case.concurrency,
            config.request_timeout_s,
            f"{connector}.{case.name}.{round_index}.",
        )
    )
    wall = time.perf_counter() - started
    cpu = sessions_cpu_s(served.engine_pids()) - cpu_before
    gained = since(scrape(served.decode_urls()), metrics_before)
    tokens = [tuple(c.tokens) for c in out]
    failures = [c for c in out if c.error]
    reference = expected if expected is not None else tokens
    equal = sum(
        1 for c, want in zip(out, reference, strict=True) if not c.error and tuple(c.tokens) == want
    )
    run = Run(
        connector=connector,
        case=case.name,
        round=round_index,
        requests=len(out),
        equal=equal,
        failures=len(failures),
        wall_s=wall,
        cpu_s=cpu,
        ttft_s=[c.ttft_s for c in out if c.ttft_s is not None],
        itl_s=[g for c in out for g in c.itl_s],
        engine_itl_s=histogram_quantile(gained, ENGINE_ITL, 0.5),
        prompt_tokens=sum(len(p) for p in prompts),
        prompt_sources=prompt_tokens_by_source(gained),
    )
    return run, out


def token_ids(completions: Sequence[Completion]) -> list[tuple[int, ...]]:
    return [tuple(c.tokens) for c in completions]


def deployment_for(
    connector: str,
    model_dir: Path,
    log_dir: Path,
    config: E2EConfig,
    timeline_dir: Path | None = None,
) -> Deployment | NixlDeployment | MooncakeDeployment:
    """``timeline_dir``: where moriio's router and engines record their timelines."""
    front = ("--first-token-ahead",) if config.first_token_ahead else ()
    if connector == "mooncake":
        return MooncakeDeployment(
            model_dir, log_dir, start_timeout_s=config.start_timeout_s, proxy_args=front
        )
    if connector.startswith("nixl"):
        return NixlDeployment(
            model_dir,
            log_dir,
            progress_thread=connector == "nixl-default",
            start_timeout_s=config.start_timeout_s,
            proxy_args=front,
        )
    mode = "write" if connector == "moriio-write" else "read"
    extra = {} if mode == "write" else {"load_mode": connector.rsplit("-", 1)[1]}
    env = {} if timeline_dir is None else {TIMELINE_DIR_ENV: str(timeline_dir)}
    return Deployment(
        model_dir,
        mode,
        log_dir,
        start_timeout_s=config.start_timeout_s,
        connector_extra=extra,
        env=env,
        router_args=front,
    )


def _round_of(
    connector: str,
    round_index: int,
    root: Path,
    model_dir: Path,
    cases: Sequence[Case],
    prompts: dict[str, list[Prompt]],
    expected: dict[str, list[tuple[int, ...]]],
    config: E2EConfig,
    progress: Progress,
) -> tuple[list[Run], list[dict[str, Any]], list[dict[str, Any]]]:
    """Every case on a fresh deployment of ``connector``; its runs, with ``config.explain``
    each case's stages (moriio only: the others record no timeline), with ``config.sweep``
    the rows of ``vllm bench serve``."""
    log_dir = root / f"round{round_index}" / connector
    traced = config.explain and connector.startswith("moriio")
    timeline_dir = log_dir / "timeline" if traced else None
    runs: list[Run] = []
    explained: list[dict[str, Any]] = []
    model = str(model_dir)
    warmup = case_prompts(Case("warmup", 1, 64), 1, config.seed)
    with deployment_for(connector, model_dir, log_dir, config, timeline_dir) as served:
        served.start(progress)
        run_case(served, connector, CASES[0], warmup, None, config, model, round_index)
        for case in cases:
            run, answers = run_case(
                served,
                connector,
                case,
                prompts[case.name],
                expected[case.name],
                config,
                model,
                round_index,
            )
            runs.append(run)
            progress(
                f"  {case.name}: {run.requests_per_s:.2f} req/s, {run.equal}/{run.requests} equal"
            )
            if timeline_dir is not None:
                times = request_times(read_events(timeline_dir), answers)
                figures = explain(times, stages_for(connector, config.first_token_ahead))
                explained.append(
                    {
                        "connector": connector,
                        "case": case.name,
                        "round": round_index,
                        "stages": [asdict(f) for f in figures],
                    }
                )
        swept = []
        if config.sweep is not None:
            progress("  vllm bench serve")
            swept = run_sweep(served.router_url, model, connector, config.sweep, log_dir)
    return runs, explained, swept


def _prefill_alone(
    model_dir: Path,
    root: Path,
    cases: Sequence[Case],
    prompts: dict[str, list[Prompt]],
    expected: dict[str, list[tuple[int, ...]]],
    config: E2EConfig,
    on_run: Callable[[Run], None] | None,
) -> list[Run]:
    """Every case on one plain engine bound where a 1P1D deployment binds its prefill."""
    bind = engine_cpu_binds(2)[0]
    runs = []
    with PlainEngine(model_dir, root, config.start_timeout_s, PREFILL_ALONE, bind) as alone:
        warmup = case_prompts(Case("warmup", 1, 64), 1, config.seed)
        run_case(alone, PREFILL_ALONE, CASES[0], warmup, None, config, str(model_dir), 0, 1)
        for case in cases:
            firsts = [tokens[:1] for tokens in expected[case.name]]
            run, _ = run_case(
                alone, PREFILL_ALONE, case, prompts[case.name], firsts, config, str(model_dir), 0, 1
            )
            runs.append(run)
            if on_run is not None:
                on_run(run)
    return runs


def run_e2e(
    config: E2EConfig, progress: Progress, on_run: Callable[[Run], None] | None = None
) -> dict[str, Any]:
    """The baseline, then the rounds; every :class:`Run`, and the log directory."""
    config.validate()
    root = Path(config.log_dir) if config.log_dir else Path(tempfile.mkdtemp(prefix="moriio-e2e-"))
    root.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model(ServeDemoConfig(model_cache_dir=config.model_cache_dir))
    model = str(model_dir)
    cases = [c for c in CASES if c.name in config.cases]
    prompts = {c.name: case_prompts(c, config.requests, config.seed) for c in cases}
    warmup = case_prompts(Case("warmup", 1, 64), 1, config.seed)
    runs: list[Run] = []
    explained: list[dict[str, Any]] = []
    sweep: list[dict[str, Any]] = []
    expected: dict[str, list[tuple[int, ...]]] = {}
    progress("baseline: one plain vLLM server")
    with PlainEngine(model_dir, root, config.start_timeout_s) as plain:
        run_case(plain, BASELINE, CASES[0], warmup, None, config, model, 0)
        for case in cases:
            run, answers = run_case(
                plain, BASELINE, case, prompts[case.name], None, config, model, 0
            )
            expected[case.name] = token_ids(answers)
            runs.append(run)
            if on_run is not None:
                on_run(run)
        if config.sweep is not None:
            progress("  vllm bench serve")
            sweep += run_sweep(plain.router_url, model, BASELINE, config.sweep, root / "vllm-bench")
    if config.prefill_limit:
        progress("prefill limit: one plain vLLM server on a prefill's core, max_tokens 1")
        runs += _prefill_alone(model_dir, root, cases, prompts, expected, config, on_run)
    for round_index in range(config.rounds):
        shift = round_index % len(config.connectors)
        order = config.connectors[shift:] + config.connectors[:shift]
        for connector in order:
            progress(f"round {round_index + 1}/{config.rounds}: {connector}")
            served_runs, stages, swept = _round_of(
                connector, round_index, root, model_dir, cases, prompts, expected, config, progress
            )
            for run in served_runs:
                runs.append(run)
                if on_run is not None:
                    on_run(run)
            explained += stages
            sweep += [{**row, "round": round_index} for row in swept]
    return {"log_dir": str(root), "runs": runs, "explained": explained, "sweep": sweep}
