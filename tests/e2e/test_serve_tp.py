"""Engines of different TP sizes behind ``moriio router``: KV heads split between the ranks.

One deployment per mode: two prefill engines (TP 1, TP 2) and two decode engines (TP 2,
TP 1), started in two waves so that the router's pools list them in that order, and its
round robin pairs every request's prefill with a decode of the other TP size: TP 1 -> TP 2
(each decode rank takes its slice of the prefill's pages) and TP 2 -> TP 1 (each decode page
gathered from both prefill ranks). The tiny Llama has 2 KV heads (one per rank at TP 2) and
runs in float32, so its answers are a plain engine's whatever the TP sizes; every answer
must equal that reference, the prompt's KV must have come over the wire, and nothing may stay
held. The tiny Qwen3-Next's state slicing is served only as a refusal here: its bfloat16
answers change with the TP size, so a plain engine is no reference for a TP pair.

The engines' OpenMP threads are not bound, one per worker (six workers on this host's two
cores): bound, a TP 2 engine would need a core list per rank.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest

from moriio_tools.harness import (
    Deployment,
    build_prompts,
    held_blocks,
    prepare_model,
    prompt_tokens_by_source,
    run_batch,
    run_mode,
)
from support.llama_reference import LlamaReference
from support.model_references import model_config
from support.prompt_kv import assert_prompt_kv_over_the_wire, summary_sources

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

TP = ("--tensor-parallel-size",)
SLOTS = {
    "prefill0": (*TP, "1"),
    "prefill1": (*TP, "2"),
    "decode0": (*TP, "2"),
    "decode1": (*TP, "1"),
}
# The router's pools in this order: turn 0 pairs prefill0 (TP 1) with decode0 (TP 2), turn 1
# prefill1 (TP 2) with decode1 (TP 1).
WAVES = (("prefill0", "decode0"), ("prefill1", "decode1"))
UNBOUND = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
REQUESTS = 4  # two each way: one alone, then three at once (turns 1, 2, 3)


@pytest.mark.parametrize("mode", ["read", "write"])
def test_prefill_and_decode_of_different_tp_sizes_answer_like_the_reference(
    llama_reference: LlamaReference, tmp_path: Path, mode: str
) -> None:
    model_dir, prompts, expected = llama_reference.prompt_set("tp")
    config = model_config(
        "llama",
        requests=REQUESTS - 1,
        idle_requests=1,
        idle_gap_s=0.5,
        prefill=2,
        decode=2,
        env=UNBOUND,
        slot_args=SLOTS,
        waves=WAVES,
    )
    summary = run_mode(mode, model_dir, prompts, expected, config, tmp_path, lambda _: None)
    _check(summary)


def _check(summary: dict[str, Any]) -> None:
    detail = {k: v for k, v in summary.items() if k != "router"}
    urls, router = summary["engine_urls"], summary["router"]
    assert router["prefill"] == [urls["prefill0"], urls["prefill1"]], router
    assert router["decode"] == [urls["decode0"], urls["decode1"]], router
    assert summary["requests"] == REQUESTS
    assert summary["failures"] == 0, detail
    assert summary["mismatches"] == 0, detail
    assert summary["held_blocks_prefill"] == 0, detail
    assert summary["held_blocks_decode"] == 0, detail
    assert summary["load_failures"] == 0, detail
    assert summary["expired_leases"] == 0, detail
    assert summary["kv_bytes"] > 0, detail
    assert router["failed"] == 0, detail
    assert_prompt_kv_over_the_wire(
        summary_sources(summary), summary["prompt_tokens"], computed=0, detail=detail
    )
    assert summary["ok"] is True, detail


def test_shards_that_do_not_line_up_are_refused_by_layer_and_hold_nothing(
    tmp_path: Path,
) -> None:
    """A TP 2 prefill storing Qwen3-Next's convolution state as (state, dim) and a TP 1
    decode storing it as (dim, state): the handshake names the layer, group and field, every
    request fails, no prompt token crosses, and no block stays held on either side (WRITE:
    the mode where a refused transfer used to leave the prefill's blocks held)."""
    model = "qwen3-next"
    config = model_config(model)
    model_dir = prepare_model(config)
    deployment = Deployment(
        model_dir,
        "write",
        tmp_path,
        connector_extra={"transfer_timeout": 5.0, "defer_timeout": 10.0},
        engine_args=config.all_engine_args(),
        prefill_engine_args=(*TP, "2"),
        env=UNBOUND,
        slot_env={"decode0": {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}},
    )
    prompts = list(enumerate(build_prompts(2, seed=3)))
    with deployment:
        deployment.start(lambda _: None)
        url = f"{deployment.router_url}/v1/completions"
        out = asyncio.run(run_batch(url, str(model_dir), prompts, 4, gap_s=0.5))
        failed_at = time.monotonic()
        while True:  # the blocks go free once the requests failed, without any timeout
            samples = {slot.name: deployment.metrics(slot) for slot in deployment.slots}
            if all(held_blocks(s) == 0 for s in samples.values()):
                break
            assert time.monotonic() - failed_at < 5.0, samples  # defer_timeout is 10 s
            time.sleep(0.25)
    assert [c.index for c in out if c.error is None] == []
    decode = samples["decode0"]
    assert prompt_tokens_by_source(decode)["external_kv_transfer"] == 0
    logs = (tmp_path / "prefill0.log").read_text(errors="replace")
    assert re.search(r"group \d+: gdn_attn state, plane 0: rows differs \(ours=3, theirs=1\)", logs)
