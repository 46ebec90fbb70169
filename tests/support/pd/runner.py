"""A real 1P1D run: two vLLM CPU engines, KV moved by the moriio connector over NIXL.

Sequence: start the prefill then the decode engine (serially: faster on few cores);
compute the single-engine baseline on the prefill engine (no transfer parameters) and drop
its prefix cache; route the requests wave by wave through
:class:`~support.pd.process_proxy.ProcessProxy`; let both engines settle; compare every decode
output with the baseline.

Transfer figures come from the side that posts the transfers (READ: decode, WRITE:
prefill): ``kv_bytes`` is its poster's byte counter; a request's transfer latency is the
span from its first batch posted to its last batch seen complete; ``transfer_gbps`` is
``kv_bytes`` over the time any transfer was in flight (the union of the spans).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from moriio_tools.harness import (
    ENGINE_ENV,
    ConnectorRef,
    EngineError,
    EngineProcess,
    EngineSnapshot,
    EngineSpec,
    KVRole,
    Prompt,
    Submit,
    build_prompts,
    busy_seconds,
    connector_config,
    free_ports,
    percentile,
    stop_all,
)
from support.pd.process_proxy import ProcessProxy, RoutedRequest, RouteResult
from support.pd.routing import HOST, Address, connector_extra

MODES = ("read", "write")
TESTS_ROOT = Path(__file__).resolve().parents[2]  # where `e2e.*` test connectors import from

Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``; ``done``/``total`` count requests in the P/D phase."""


@dataclass(frozen=True, slots=True)
class PDRunConfig:
    mode: str = "read"
    requests: int = 16
    prompt_len: int | None = None  # None: special lengths, then random 33..200
    concurrency: int = 4
    max_tokens: int = 16
    seed: int = 0
    prefill_connector: ConnectorRef = field(default_factory=ConnectorRef)
    decode_connector: ConnectorRef = field(default_factory=ConnectorRef)
    log_dir: str | None = None  # None: a new directory under the system temp dir
    model_cache_dir: str | None = None
    start_timeout_s: float = 300.0
    wave_timeout_s: float = 120.0
    settle_timeout_s: float = 15.0

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.prompt_len is not None and not 1 <= self.prompt_len <= 1024 - self.max_tokens:
            raise ValueError(
                f"prompt_len must be in [1, {1024 - self.max_tokens}] "
                f"(max_model_len 1024 minus max_tokens), got {self.prompt_len}"
            )


def run_pd(config: PDRunConfig, progress: Progress | None = None) -> dict[str, Any]:
    """One mode end to end; returns the summary (see :func:`summarize`)."""
    config.validate()
    report = progress or (lambda phase, done, total: None)
    started = time.monotonic()
    prompts = build_prompts(config.requests, config.prompt_len, seed=config.seed)
    waves = plan_waves(prompts, config.concurrency)
    log_dir = Path(config.log_dir or tempfile.mkdtemp(prefix="moriio-pd-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    ports = free_ports(4)
    p_addr = Address(HOST, ports[0], ports[1])
    d_addr = Address(HOST, ports[2], ports[3])
    read_mode = config.mode == "read"
    prefill = EngineProcess(_spec(config, "prefill", "kv_producer", p_addr, log_dir))
    decode = EngineProcess(_spec(config, "decode", "kv_consumer", d_addr, log_dir))
    total = len(prompts)
    timings: dict[str, float] = {}
    try:
        report("starting prefill engine", 0, total)
        prefill.start(config.start_timeout_s)
        report("starting decode engine", 0, total)
        decode.start(config.start_timeout_s)
        timings["startup_s"] = time.monotonic() - started
        report("baseline on the prefill engine", 0, total)
        mark = time.monotonic()
        baseline = _baseline(prefill, prompts, config)
        prefill.reset_prefix_cache()
        timings["baseline_s"] = time.monotonic() - mark
        proxy = ProcessProxy(
            prefill, decode, read_mode=read_mode, prefill_address=p_addr, decode_address=d_addr
        )
        results: list[RouteResult] = []
        mark = time.monotonic()
        phase = f"{config.mode} transfers"
        report(phase, 0, total)
        finished = [0]

        def on_done(_: RouteResult) -> None:
            finished[0] += 1
            report(phase, finished[0], total)

        for wave in waves:
            requests = [RoutedRequest(f"r{i}", prompts[i], config.max_tokens) for i in wave]
            results += proxy.run_wave(requests, timeout_s=config.wave_timeout_s, on_done=on_done)
        timings["pd_s"] = time.monotonic() - mark
        report("settling", total, total)
        p_snap = prefill.snapshot(config.settle_timeout_s)
        d_snap = decode.snapshot(config.settle_timeout_s)
    finally:
        stop_all([decode, prefill])
    timings["wall_s"] = time.monotonic() - started
    exit_codes = {"prefill": prefill.exitcode, "decode": decode.exitcode}
    return summarize(
        config,
        prompts=prompts,
        baseline=baseline,
        results=results,
        snapshots=(p_snap, d_snap),
        timings=timings,
        waves=len(waves),
        log_dir=log_dir,
        exit_codes=exit_codes,
    )


def plan_waves(prompts: Sequence[Prompt], concurrency: int) -> list[list[int]]:
    """Indices of ``prompts`` in waves of at most ``concurrency``; a prompt already in the
    current wave starts a new one (a repeat must find the first run's cached blocks)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    waves: list[list[int]] = []
    current: list[int] = []
    seen: set[Prompt] = set()
    for index, prompt in enumerate(prompts):
        if len(current) >= concurrency or prompt in seen:
            waves.append(current)
            current, seen = [], set()
        current.append(index)
        seen.add(prompt)
    if current:
        waves.append(current)
    return waves


def _spec(
    config: PDRunConfig, name: str, role: KVRole, address: Address, log_dir: Path
) -> EngineSpec:
    connector = config.prefill_connector if role == "kv_producer" else config.decode_connector
    return EngineSpec(
        name=name,
        kv_transfer_config=connector_config(
            role, connector_extra(config.mode == "read", address), connector
        ),
        log_path=str(log_dir / f"{name}.log"),
        model_cache_dir=config.model_cache_dir,
        env={**ENGINE_ENV, "PYTHONPATH": _with_tests_on_path()},
        max_num_seqs=max(16, config.concurrency),
    )


def _with_tests_on_path() -> str:
    """``PYTHONPATH`` with this tree's ``tests`` first: connectors the tests define load."""
    path = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (str(TESTS_ROOT), path) if p)


def _baseline(
    engine: EngineProcess, prompts: Sequence[Prompt], config: PDRunConfig
) -> dict[Prompt, tuple[int, ...]]:
    """Greedy outputs of the prefill engine alone, for every distinct prompt."""
    unique = list(dict.fromkeys(prompts))
    engine.submit([Submit(f"b{i}", prompt, config.max_tokens) for i, prompt in enumerate(unique)])
    outputs: dict[str, tuple[int, ...]] = {}
    deadline = time.monotonic() + config.wave_timeout_s
    while len(outputs) < len(unique):
        if time.monotonic() >= deadline:
            raise EngineError(f"baseline not done within {config.wave_timeout_s:.0f} s")
        wait([engine.connection], timeout=0.5)
        engine.pump()
        outputs.update((f.key, f.token_ids) for f in engine.take_finished())
    return {prompt: outputs[f"b{i}"] for i, prompt in enumerate(unique)}


def summarize(
    config: PDRunConfig,
    *,
    prompts: Sequence[Prompt],
    baseline: dict[Prompt, tuple[int, ...]],
    results: Sequence[RouteResult],
    snapshots: tuple[EngineSnapshot, EngineSnapshot],
    timings: dict[str, float],
    waves: int,
    log_dir: Path,
    exit_codes: dict[str, int | None] | None = None,
) -> dict[str, Any]:
    """The run's summary: the stable keys ``mode``, ``requests``, ``mismatches``,
    ``failures``, ``held_blocks_prefill``, ``held_blocks_decode``, ``kv_bytes``,
    ``transfer_gbps``, ``transfer_latency_ms_p50``, ``transfer_latency_ms_p99``, and more."""
    p_snap, d_snap = snapshots
    by_key = {r.key: r for r in results}
    mismatches = mismatched_tokens = prefill_mismatches = completed = 0
    errors: list[str] = []
    for index, prompt in enumerate(prompts):
        result = by_key.get(f"r{index}")
        expected = baseline[prompt]
        if result is None or result.error is not None or result.decode_tokens is None:
            errors.append(f"r{index}: {result.error if result else 'never routed'}")
            continue
        completed += 1
        got = result.decode_tokens
        if got != expected:
            mismatches += 1
            mismatched_tokens += sum(a != b for a, b in zip(got, expected, strict=False))
            mismatched_tokens += abs(len(got) - len(expected))
        if result.prefill_tokens is not None and result.prefill_tokens[:1] != expected[:1]:
            prefill_mismatches += 1
    spans = [*p_snap.transfers, *d_snap.transfers]
    latencies = [s.end - s.start for s in spans if s.ok]
    kv_bytes = sum(s.counters.get("bytes_moved", 0) for s in snapshots)
    busy = busy_seconds(s for s in spans if s.ok)
    transfer_failures = sum(
        s.counters.get("transfers_failed", 0) + s.counters.get("transfers_expired", 0)
        for s in snapshots
    )
    kinds: dict[str, int] = {}
    for snap in snapshots:
        for kind, count in snap.failures_by_kind.items():
            kinds[kind] = kinds.get(kind, 0) + count
    failures = len(errors) + transfer_failures
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    summary: dict[str, Any] = {
        "mode": config.mode,
        "requests": len(prompts),
        "completed": completed,
        "mismatches": mismatches,
        "mismatched_tokens": mismatched_tokens,
        "prefill_token_mismatches": prefill_mismatches,
        "prompt_sources": dict(d_snap.prompt_sources),
        "failures": failures,
        "failures_by_kind": kinds,
        "errors": errors[:10],
        "held_blocks_prefill": p_snap.held_blocks,
        "held_blocks_decode": d_snap.held_blocks,
        "held_requests_prefill": p_snap.scheduler_requests,
        "held_requests_decode": d_snap.scheduler_requests,
        "kv_bytes": kv_bytes,
        "transfers": len(spans),
        "transfer_gbps": float(f"{kv_bytes / busy / 1e9:.4g}") if busy > 0 else None,
        "transfer_latency_ms_p50": round(p50 * 1e3, 3) if p50 is not None else None,
        "transfer_latency_ms_p99": round(p99 * 1e3, 3) if p99 is not None else None,
        "prompt_tokens": sum(len(p) for p in prompts),
        "generated_tokens": sum(len(r.decode_tokens or ()) for r in results),
        "max_tokens": config.max_tokens,
        "concurrency": config.concurrency,
        "waves": waves,
        "startup_s": round(timings.get("startup_s", 0.0), 2),
        "baseline_s": round(timings.get("baseline_s", 0.0), 2),
        "pd_s": round(timings.get("pd_s", 0.0), 2),
        "wall_s": round(timings.get("wall_s", 0.0), 2),
        "decode_connector": config.decode_connector.class_name,
        "engine_exit_codes": dict(exit_codes or {}),
        "log_dir": str(log_dir),
    }
    summary["ok"] = (
        mismatches == 0
        and failures == 0
        and completed == len(prompts)
        and summary["held_blocks_prefill"] == 0
        and summary["held_blocks_decode"] == 0
    )
    return summary
