"""The main job: a real P/D deployment driven over HTTP, checked against one engine.

1. Write the demo model and its tokenizer (cached), start one plain vLLM server and take
   every prompt's greedy output from it: the baseline. Stop it.
2. Per transfer mode: start ``moriio router`` and the prefill and decode servers (they
   register with the router by themselves) and send the prompts through the router:
   * an idle phase: requests one at a time, ``idle_gap_s`` apart, so that both engines
     fall idle between requests (``vllm serve`` stops stepping an engine with no work);
   * a concurrent phase: every remaining request in flight at once.
3. Wait until both sides hold no block, read the engines' ``/metrics`` and compare every
   output with the baseline, token for token.

Transfer figures come from the connector's Prometheus series: ``kv_bytes`` is
``vllm:moriio_bytes_total`` summed over the engines; ``transfer_gbps`` is that over the
summed batch time (``vllm:moriio_xfer_time_seconds_sum``, posting to completion);
transfer latency is ``vllm:moriio_load_time_seconds`` on the decode engines, from the load
order to the KV having landed (quantiles interpolated in its buckets; in WRITE mode it starts
when the decode announces its blocks, so it includes the prefill's own compute);
``batch_ms_p99`` is the posting-to-completion time of the transfer batches alone.
``prompt_tokens_external`` / ``_local`` / ``_local_cache_hit`` are vLLM's
``vllm:prompt_tokens_by_source`` on the decode engines: loaded by the connector, computed,
found in the decode's prefix cache. A run passes only when none was computed (but each last
token after a synchronous load), so equal outputs cannot come from a silent recompute.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moriio_tools.models import DEFAULT_MODEL, MODEL_NAMES, zoo_model
from moriio_tools.models.store import ensure_model
from moriio_tools.prompts import Prompt, build_prompts
from moriio_tools.serve.client import Completion, run_batch
from moriio_tools.serve.deployment import Deployment
from moriio_tools.serve.metrics import (
    Sample,
    held_blocks,
    histogram_quantile,
    prompt_tokens_by_source,
    since,
    total,
)
from moriio_tools.serve.nixl_reference import nixl_reference
from moriio_tools.serve.processes import free_ports, vllm_server
from moriio_tools.serve.tokenizer import has_tokenizer, write_tokenizer

MODES = ("read", "write")
ROUTERS = ("moriio", "vllm-router")
SOLO_GAP_S = 0.05  # between requests sent one at a time to a batch-dependent model
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ServeDemoConfig:
    modes: tuple[str, ...] = MODES
    requests: int = 16  # concurrent phase: all in flight at once
    idle_requests: int = 4  # idle phase: one at a time, idle_gap_s apart
    idle_gap_s: float = 3.0
    prompt_len: int | None = None  # None: 64, 96, 33, 65, then random 33..200
    max_tokens: int = 16
    seed: int = 0
    prefill: int = 1
    decode: int = 1
    log_dir: str | None = None
    model_cache_dir: str | None = None
    settle_timeout_s: float = 30.0
    connector_extra: dict[str, Any] = field(default_factory=dict)
    engine_args: tuple[str, ...] = ()  # extra `vllm serve` flags for every engine
    router: str = "moriio"  # or "vllm-router"
    model: str = DEFAULT_MODEL  # one of moriio_tools.models.MODEL_NAMES
    prefill_engine_args: tuple[str, ...] = ()  # extra flags for the prefill engines only
    decode_engine_args: tuple[str, ...] = ()  # extra flags for the decode engines only
    env: dict[str, str] = field(default_factory=dict)  # for the router and every engine
    slot_args: dict[str, tuple[str, ...]] = field(default_factory=dict)  # by engine name
    waves: tuple[tuple[str, ...], ...] = ()  # engines started in this order (see Deployment)

    @property
    def burst_gap_s(self) -> float:
        """0: the concurrent phase sends every request at once. A model whose outputs depend
        on the batch (see :class:`~moriio_tools.models.ZooModel`) gets them one at a time."""
        return 0.0 if zoo_model(self.model).batch_invariant else SOLO_GAP_S

    def all_engine_args(self) -> tuple[str, ...]:
        """The model's own ``vllm serve`` flags, then :attr:`engine_args` (which win)."""
        return (*zoo_model(self.model).engine_args, *self.engine_args)

    def validate(self) -> None:
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if self.requests < 1 or self.idle_requests < 0:
            raise ValueError("requests must be >= 1 and idle_requests >= 0")
        if self.prefill < 1 or self.decode < 1:
            raise ValueError("prefill and decode must be >= 1")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.model not in MODEL_NAMES:
            raise ValueError(f"model must be one of {', '.join(MODEL_NAMES)}, got {self.model!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if self.idle_gap_s < 0:
            raise ValueError(f"idle_gap_s must be >= 0, got {self.idle_gap_s}")
        if self.prompt_len is not None and not 1 <= self.prompt_len <= 1024 - self.max_tokens:
            raise ValueError(
                f"prompt_len must be in [1, {1024 - self.max_tokens}] "
                f"(max_model_len 1024 minus max_tokens), got {self.prompt_len}"
            )


def prepare_model(config: ServeDemoConfig) -> Path:
    """The directory of ``config.model`` with its tokenizer, written on first use."""
    cache = Path(config.model_cache_dir) if config.model_cache_dir else None
    spec = zoo_model(config.model).spec
    model_dir = ensure_model(cache, spec)
    if not has_tokenizer(model_dir):
        write_tokenizer(model_dir, spec.vocab_size)
    return model_dir


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(1e3 * value, 2)


def baseline(
    model_dir: Path, prompts: Sequence[Prompt], config: ServeDemoConfig, log_dir: Path
) -> list[tuple[int, ...]]:
    """Every prompt's greedy output from one plain vLLM server."""
    (port,) = free_ports(1)
    server = vllm_server(
        "baseline",
        model_dir,
        port,
        log_path=log_dir / "baseline.log",
        extra_args=config.all_engine_args(),
    )
    server.start()
    try:
        server.wait_ready(600.0)
        url = f"http://127.0.0.1:{port}/v1/completions"
        out = asyncio.run(
            run_batch(
                url,
                str(model_dir),
                list(enumerate(prompts)),
                config.max_tokens,
                gap_s=config.burst_gap_s,
            )
        )
    finally:
        server.stop()
    failed = [c for c in out if c.error]
    if failed:
        raise RuntimeError(f"baseline request {failed[0].index} failed: {failed[0].error}")
    return [tuple(c.tokens) for c in out]


def reference(
    model_dir: Path, prompts: Sequence[Prompt], config: ServeDemoConfig, log_dir: Path
) -> list[tuple[int, ...]]:
    """The outputs a deployment must give: one plain engine's (:func:`baseline`), or for a
    model a deployment cannot match that way, vLLM's NixlConnector's, one at a time."""
    if zoo_model(config.model).single_engine_reference:
        return baseline(model_dir, prompts, config, log_dir)
    engine_args = config.all_engine_args()
    return nixl_reference(model_dir, prompts, config.max_tokens, log_dir, engine_args)


def run_mode(
    mode: str,
    model_dir: Path,
    prompts: Sequence[Prompt],
    expected: Sequence[tuple[int, ...]],
    config: ServeDemoConfig,
    log_dir: Path,
    progress: Progress,
) -> dict[str, Any]:
    started = time.monotonic()
    deployment = Deployment(
        model_dir,
        mode,
        log_dir,
        prefill=config.prefill,
        decode=config.decode,
        connector_extra=config.connector_extra,
        engine_args=config.all_engine_args(),
        prefill_engine_args=config.prefill_engine_args,
        decode_engine_args=config.decode_engine_args,
        router=config.router,
        env=config.env,
        slot_args=config.slot_args,
        waves=config.waves,
    )
    with deployment:
        deployment.start(progress)
        startup_s = time.monotonic() - started
        url = f"{deployment.router_url}/v1/completions"
        indexed = list(enumerate(prompts))
        idle, burst = indexed[: config.idle_requests], indexed[config.idle_requests :]
        progress(f"{mode}: idle phase, {len(idle)} requests {config.idle_gap_s:g} s apart")
        phase_started = time.monotonic()
        idle_out = asyncio.run(
            run_batch(url, str(model_dir), idle, config.max_tokens, gap_s=config.idle_gap_s)
        )
        after_idle = _decode_samples(deployment)
        gap = config.burst_gap_s
        alone = f", one at a time ({config.model} is batch-dependent)" if gap else ""
        progress(f"{mode}: concurrent phase, {len(burst)} requests{alone}")
        burst_out = asyncio.run(run_batch(url, str(model_dir), burst, config.max_tokens, gap_s=gap))
        pd_s = time.monotonic() - phase_started
        progress(f"{mode}: settling")
        samples = _settle(deployment, config.settle_timeout_s)
        summary = summarize(
            mode,
            idle_out,
            burst_out,
            expected,
            prompts,
            samples,
            deployment,
            computes_last_token=zoo_model(config.model).recurrent_state
            or (mode == "read" and config.connector_extra.get("load_mode") == "layerwise"),
        )
        final = [s for name, e in samples.items() if name.startswith("decode") for s in e]
        for phase, part in (("idle", after_idle), ("concurrent", since(final, after_idle))):
            for q in (50, 99):
                value = histogram_quantile(part, "vllm:moriio_load_time_seconds", q / 100)
                summary[f"{phase}_transfer_latency_ms_p{q}"] = _ms(value)
    summary.update(startup_s=round(startup_s, 1), pd_s=round(pd_s, 1), log_dir=str(log_dir))
    summary["engine_urls"] = {slot.name: slot.url for slot in deployment.slots}
    summary["wall_s"] = round(time.monotonic() - started, 1)
    return summary


def _decode_samples(deployment: Deployment) -> list[Sample]:
    return [
        s for slot in deployment.slots if slot.role == "decode" for s in deployment.metrics(slot)
    ]


def _settle(deployment: Deployment, timeout: float) -> dict[str, list[Sample]]:
    """Metrics of every engine once none holds a block (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = {slot.name: deployment.metrics(slot) for slot in deployment.slots}
        if all(held_blocks(s) == 0 for s in samples.values()) or time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


def summarize(
    mode: str,
    idle: Sequence[Completion],
    burst: Sequence[Completion],
    expected: Sequence[tuple[int, ...]],
    prompts: Sequence[Prompt],
    samples: dict[str, list[Sample]],
    deployment: Deployment,
    *,
    computes_last_token: bool = False,
) -> dict[str, Any]:
    """One run's verdict. ``computes_last_token``: the decode computes each prompt's last
    token itself (a synchronous load, or a model with recurrent state); asynchronous loads
    of attention KV cover the whole prompt."""
    results = [*idle, *burst]
    failures = [c for c in results if c.error]
    mismatches = [c for c in results if not c.error and tuple(c.tokens) != expected[c.index]]
    every = [s for engine in samples.values() for s in engine]
    decode = [s for name, engine in samples.items() if name.startswith("decode") for s in engine]

    def held(role: str) -> int:
        return sum(held_blocks(s) for name, s in samples.items() if name.startswith(role))

    prefill = [s for name, e in samples.items() if name.startswith("prefill") for s in e]
    kv_bytes = int(total(every, "vllm:moriio_bytes_total"))
    # A prompt sent twice may find all its blocks in the decode's prefix cache: no load.
    repeats = len(prompts) - len(set(prompts))
    busy = total(every, "vllm:moriio_xfer_time_seconds_sum")
    loads = int(total(decode, "vllm:moriio_load_time_seconds_count"))
    sources = prompt_tokens_by_source(decode)
    itl = [g for c in results for g in c.itl_s]
    ttft = [c.ttft_s for c in results if c.ttft_s is not None]
    summary: dict[str, Any] = {
        "mode": mode,
        "engines": f"{deployment.prefill}P{deployment.decode}D",
        "router_name": deployment.router,
        "requests": len(results),
        "completed": len(results) - len(failures),
        "mismatches": len(mismatches),
        "failures": len(failures),
        "failure_examples": [f"#{c.index}: {c.error}" for c in failures[:3]],
        "held_blocks_prefill": held("prefill"),
        "held_blocks_decode": held("decode"),
        "loads": loads,
        "load_failures": int(total(decode, "vllm:moriio_failed_total")),
        "expired_leases": int(total(prefill, "vllm:moriio_expired_leases_total")),
        "kv_bytes": kv_bytes,
        "transfer_gbps": round(kv_bytes / busy / 1e9, 3) if busy > 0 else None,
        "transfer_latency_ms_p50": _ms(
            histogram_quantile(decode, "vllm:moriio_load_time_seconds", 0.5)
        ),
        "transfer_latency_ms_p99": _ms(
            histogram_quantile(decode, "vllm:moriio_load_time_seconds", 0.99)
        ),
        "batch_ms_p99": _ms(histogram_quantile(every, "vllm:moriio_xfer_time_seconds", 0.99)),
        "ttft_ms_p50": _ms(_percentile(ttft, 0.5)),
        "ttft_ms_p99": _ms(_percentile(ttft, 0.99)),
        "itl_ms_p50": _ms(_percentile(itl, 0.5)),
        "idle_ttft_ms_p50": _ms(_percentile([c.ttft_s for c in idle if c.ttft_s], 0.5)),
        "idle_ttft_ms_p99": _ms(_percentile([c.ttft_s for c in idle if c.ttft_s], 0.99)),
        "concurrent_ttft_ms_p50": _ms(_percentile([c.ttft_s for c in burst if c.ttft_s], 0.5)),
        "concurrent_ttft_ms_p99": _ms(_percentile([c.ttft_s for c in burst if c.ttft_s], 0.99)),
        "prompt_tokens": sum(len(prompts[c.index]) for c in results),
        # The decode engines' view: every prompt token loaded over the wire or found in
        # their own prefix cache, none recomputed (but the last one of a synchronous load).
        "prompt_tokens_external": sources["external_kv_transfer"],
        "prompt_tokens_local": sources["local_compute"],
        "prompt_tokens_local_cache_hit": sources["local_cache_hit"],
        "router": deployment.router_stats(),
    }
    computed = len(results) if computes_last_token else 0
    summary["ok"] = (
        not failures
        and not mismatches
        and summary["held_blocks_prefill"] == 0
        and summary["held_blocks_decode"] == 0
        and loads >= len(results) - repeats
        and summary["load_failures"] == 0
        and summary["expired_leases"] == 0
        and summary["prompt_tokens_local"] == computed
        and summary["prompt_tokens_external"]
        == summary["prompt_tokens"] - summary["prompt_tokens_local_cache_hit"] - computed
    )
    return summary


def run_serve_demo(config: ServeDemoConfig, progress: Progress) -> list[dict[str, Any]]:
    """Baseline, then one deployment per mode; a summary per mode."""
    config.validate()
    root = Path(config.log_dir) if config.log_dir else Path(tempfile.mkdtemp(prefix="moriio-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    progress("preparing the model and tokenizer")
    model_dir = prepare_model(config)
    prompts = build_prompts(
        config.idle_requests + config.requests, config.prompt_len, seed=config.seed
    )
    single = zoo_model(config.model).single_engine_reference
    progress(f"reference: {'one plain vLLM server' if single else 'vLLM NixlConnector 1P1D'}")
    expected = reference(model_dir, prompts, config, root)
    return [
        run_mode(mode, model_dir, prompts, expected, config, root / mode, progress)
        for mode in config.modes
    ]
