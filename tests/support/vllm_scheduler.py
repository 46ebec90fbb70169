"""The vLLM config the tests drive the moriio connector with, on the scheduler benchmark's builders.

Scheduler, requests and the fake worker's output come straight from
:mod:`moriio_tools.vllm_harness`; only the tests' defaults live here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

# First: sets HF_HUB_OFFLINE before vLLM is imported.
from moriio_tools.vllm_harness import CONNECTORS
from moriio_tools.vllm_harness import make_vllm_config as make_bench_config

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.kv_transfer import KVRole

CONNECTOR_CLASS, CONNECTOR_MODULE = CONNECTORS["moriio"]


def make_vllm_config(
    kv_role: KVRole,
    extra: Mapping[str, Any],
    *,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 1024,
    max_model_len: int = 4096,
    connector: str = CONNECTOR_CLASS,
    module: str | None = CONNECTOR_MODULE,
) -> VllmConfig:
    """The tiny model with ``connector`` (the moriio connector by default) in ``kv_role``."""
    return make_bench_config(
        kv_role,
        extra,
        connector=connector,
        module=module,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
    )
