"""Where an engine's prompt tokens came from, counted from its engine core's outputs."""

from __future__ import annotations

from typing import Any

from moriio_tools.serve.metrics import CACHED, COMPUTED, LOADED, PROMPT_SOURCES


class LoadedKV:
    """Counts, from the engine core's outputs, where each request's prompt tokens came from:
    loaded by the connector, found in the prefix cache, or computed (vLLM's own prefill
    stats, in the vocabulary of :data:`moriio_tools.serve.metrics.PROMPT_SOURCES`)."""

    def __init__(self, engine: Any) -> None:
        self.requests = 0  # requests with some prompt KV loaded by the connector
        self.sources = dict.fromkeys(PROMPT_SOURCES, 0)
        client = engine.engine_core
        inner = client.get_output

        def get_output() -> Any:
            outputs = inner()
            for output in outputs.outputs:
                stats = output.prefill_stats  # once per request, as first scheduled
                if stats is None:
                    continue
                self.requests += stats.num_external_cached_tokens > 0
                self.sources[LOADED] += stats.num_external_cached_tokens
                self.sources[CACHED] += stats.num_local_cached_tokens
                self.sources[COMPUTED] += stats.num_computed_tokens
            return outputs

        client.get_output = get_output
