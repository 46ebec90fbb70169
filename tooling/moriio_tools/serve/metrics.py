"""Reading an engine's Prometheus ``/metrics``: held blocks and moriio's transfer figures."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from moriio_tools.serve.processes import http_get

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (comments skipped)."""
    out = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        out.append(Sample(match.group(1), labels, value))
    return out


def total(samples: Iterable[Sample], name: str) -> float:
    """Sum of every sample named ``name`` (over engines and label sets)."""
    return sum(s.value for s in samples if s.name == name)


ENGINE_ITL = "vllm:inter_token_latency_seconds"  # an engine's own inter-token latencies


def scrape(urls: Sequence[str]) -> list[Sample]:
    """The ``/metrics`` samples of every engine of ``urls`` (an engine that does not answer
    adds none)."""
    out: list[Sample] = []
    for url in urls:
        status, body = http_get(f"{url}/metrics")
        if status == 200:
            out += parse(body)
    return out


PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
PROMPT_SOURCES = ("external_kv_transfer", "local_compute", "local_cache_hit")
"""vLLM's sources of prompt tokens: loaded by the KV connector, computed by the engine, found
in its own prefix cache. A request counts once, as split when it is first scheduled."""


LOADED, COMPUTED, CACHED = PROMPT_SOURCES


def prompt_kv_shortfall(
    sources: Mapping[str, int], prompt_tokens: int, computed: int = 0
) -> str | None:
    """Why ``sources`` (a decode's prompt tokens per source) do not show ``prompt_tokens``
    prompt tokens loaded over the wire or found in its prefix cache with ``computed``
    computed; None when they do."""
    shown = f"{dict(sources)} for {prompt_tokens} prompt tokens"
    if not sources.get(LOADED, 0):
        return f"no prompt KV came over the wire: {shown}"
    if sources.get(COMPUTED, 0) != computed:
        return f"the decode computed prompt tokens: {shown}"
    if sources.get(LOADED, 0) + sources.get(CACHED, 0) != prompt_tokens:
        return f"loaded and cached tokens do not add up to the prompts: {shown}"
    return None


def prompt_tokens_by_source(samples: Iterable[Sample]) -> dict[str, int]:
    """Prompt tokens per source, summed over the engines of ``samples``."""
    counts = dict.fromkeys(PROMPT_SOURCES, 0.0)
    for s in samples:
        source = s.labels.get("source", "")
        if s.name == PROMPT_TOKENS_BY_SOURCE and source in counts:
            counts[source] += s.value
    return {source: int(value) for source, value in counts.items()}


def held_blocks(samples: Sequence[Sample]) -> int:
    """KV blocks in use: ``kv_cache_usage_perc`` times the block count of the engine.

    Cached blocks nobody references count as free in vLLM's usage, so on an idle engine
    this is exactly the number of blocks still held (by running requests or a connector).
    """
    blocks = 0.0
    for info in (s for s in samples if s.name == "vllm:cache_config_info"):
        blocks = max(blocks, float(info.labels.get("num_gpu_blocks", "0") or 0))
    usage = total(samples, "vllm:kv_cache_usage_perc")
    # vLLM's usage is (used) / (total - 1): the null block is never free nor counted.
    return round(usage * max(blocks - 1, 0))


def since(later: Sequence[Sample], earlier: Sequence[Sample]) -> list[Sample]:
    """``later`` minus ``earlier`` per series: what counters and histograms gained between
    two scrapes of the same engines."""
    before = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in earlier}
    return [
        Sample(s.name, s.labels, s.value - before.get((s.name, tuple(sorted(s.labels.items()))), 0))
        for s in later
    ]


def histogram_quantile(samples: Sequence[Sample], name: str, q: float) -> float | None:
    """Prometheus' ``histogram_quantile`` over the ``_bucket`` series of ``name``
    (linear interpolation inside the bucket; the summed engines form one histogram)."""
    buckets: dict[float, float] = {}
    for s in samples:
        if s.name == f"{name}_bucket" and "le" in s.labels:
            bound = math.inf if s.labels["le"] == "+Inf" else float(s.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + s.value
    if not buckets:
        return None
    bounds = sorted(buckets)
    count = buckets[bounds[-1]]
    if count <= 0:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for bound in bounds:
        cumulative = buckets[bound]
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            fraction = (rank - below) / inside if inside else 1.0
            return lower + (bound - lower) * fraction
        lower, below = bound, cumulative
    return lower
