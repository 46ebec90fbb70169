"""The tooling's public entry point to its vLLM scheduler harness; imports vLLM at load.

Kept apart from :mod:`moriio_tools.harness` so that tests which never touch vLLM do not pay
for importing it. Tests under ``tests/`` import the tooling only from these two modules.
"""

from __future__ import annotations

from moriio_tools.bench.scheduler_harness import (
    BLOCK_SIZE,
    CONNECTORS,
    build_scheduler,
    make_kv_cache_config,
    make_request,
    make_vllm_config,
    model_output,
    tiny_model_dir,
)

__all__ = [
    "BLOCK_SIZE",
    "CONNECTORS",
    "build_scheduler",
    "make_kv_cache_config",
    "make_request",
    "make_vllm_config",
    "model_output",
    "tiny_model_dir",
]
