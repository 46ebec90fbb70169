"""The one check every engine test makes: the decode's prompt KV came over the wire.

Equal outputs alone could come from a decode that recomputed the prompt. vLLM counts, per
request as first scheduled, where its prompt tokens came from (``vllm:prompt_tokens_by_source``
on ``/metrics``, ``prefill_stats`` on an engine core's outputs): loaded by the KV connector,
found in the engine's own prefix cache, or computed. Over the requests a check covers, every
prompt token must be loaded or a prefix-cache hit, and none computed (but what ``computed``
allows: requests outside the check that the decode served itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from moriio_tools.harness import (
    CACHED,
    COMPUTED,
    LOADED,
    Deployment,
    Sample,
    prompt_kv_shortfall,
    prompt_tokens_by_source,
    since,
)


def assert_prompt_kv_over_the_wire(
    sources: Mapping[str, int], prompt_tokens: int, *, computed: int = 0, detail: object = ""
) -> None:
    """``sources`` (tokens per source on the decode engines) account for ``prompt_tokens``
    prompt tokens: some loaded over the wire, the rest prefix-cache hits, ``computed`` computed."""
    shortfall = prompt_kv_shortfall(sources, prompt_tokens, computed)
    assert shortfall is None, f"{shortfall}; {detail}"


def summary_sources(summary: Mapping[str, Any]) -> dict[str, int]:
    """The decode's prompt tokens per source in a serve run's summary (``run_mode``)."""
    return {
        LOADED: summary["prompt_tokens_external"],
        COMPUTED: summary["prompt_tokens_local"],
        CACHED: summary["prompt_tokens_local_cache_hit"],
    }


def decode_metrics(deployment: Deployment) -> list[Sample]:
    """Every decode engine's ``/metrics`` samples."""
    return [
        s for slot in deployment.slots if slot.role == "decode" for s in deployment.metrics(slot)
    ]


def decode_sources(deployment: Deployment, before: Sequence[Sample] = ()) -> dict[str, int]:
    """The decode engines' prompt tokens per source, gained since ``before`` (a
    :func:`decode_metrics` of the same engines)."""
    return prompt_tokens_by_source(since(decode_metrics(deployment), before))
