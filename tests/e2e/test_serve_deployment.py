"""The deployment users run: ``vllm serve`` engines behind ``moriio router``, over HTTP.

The engines register with the router by themselves (the MoRIIO toy proxy's ping protocol).
Each run has an idle phase (one request at a time, both engines idle between them) and a
concurrent phase (16 in flight). Every streamed output must equal a single plain engine's,
nothing may fail or stay held, and every KV load must land far below any timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from moriio_tools.harness import Prompt, ServeDemoConfig, run_mode, vllm_router_binary
from support.llama_reference import LlamaReference
from support.prompt_kv import assert_prompt_kv_over_the_wire, summary_sources

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

CONCURRENT = 16
IDLE = 3
# transfer_timeout is 30 s and a stall shows up as tens of seconds. Asynchronous READ loads
# count from the read order and include a first handshake run in the background; WRITE loads
# from the decode's announcement, so they include the prefill's own compute. With up to four
# engines sharing two cores both get the same bound; the transfer batches themselves must take
# well under a second in both modes.
LOAD_P99_BOUND_MS = {"read": 5000.0, "write": 5000.0}
BATCH_P99_BOUND_MS = 1000.0


@pytest.fixture(scope="module")
def reference(llama_reference: LlamaReference) -> tuple[Path, list[Prompt], list[Any]]:
    model_dir, prompts, expected = llama_reference.prompt_set("deployment")
    assert len(prompts) == IDLE + CONCURRENT
    return model_dir, prompts, expected


def _run(
    reference: tuple[Path, list[Prompt], list[Any]],
    tmp_path: Path,
    mode: str,
    prefill: int = 1,
    decode: int = 1,
    router: str = "moriio",
) -> dict[str, Any]:
    model_dir, prompts, expected = reference
    config = ServeDemoConfig(
        requests=CONCURRENT,
        idle_requests=IDLE,
        idle_gap_s=2.0,
        prefill=prefill,
        decode=decode,
        router=router,
    )
    return run_mode(mode, model_dir, prompts, expected, config, tmp_path, lambda _: None)


def _check(summary: dict[str, Any], engines: str) -> None:
    detail = {k: v for k, v in summary.items() if k != "router"}
    assert summary["engines"] == engines
    assert summary["requests"] == IDLE + CONCURRENT
    assert summary["failures"] == 0, detail
    assert summary["mismatches"] == 0, detail
    assert summary["held_blocks_prefill"] == 0, detail
    assert summary["held_blocks_decode"] == 0, detail
    assert summary["load_failures"] == 0, detail
    assert summary["expired_leases"] == 0, detail
    assert summary["loads"] >= IDLE + CONCURRENT - 2, detail  # two prompts are repeats
    assert summary["kv_bytes"] > 0
    # Asynchronous loads: the decode computes no prompt token; every one came over the wire
    # but those its own prefix cache held (the repeated prompts).
    assert_prompt_kv_over_the_wire(
        summary_sources(summary), summary["prompt_tokens"], detail=detail
    )
    assert summary["transfer_latency_ms_p99"] < LOAD_P99_BOUND_MS[summary["mode"]], detail
    assert summary["batch_ms_p99"] < BATCH_P99_BOUND_MS, detail
    if summary["router_name"] == "moriio":
        assert summary["router"]["failed"] == 0, detail
    assert summary["ok"] is True, detail


@pytest.mark.parametrize("mode", ["read", "write"])
def test_1p1d_over_vllm_serve_and_the_router(
    reference: tuple[Path, list[Prompt], list[Any]], tmp_path: Path, mode: str
) -> None:
    _check(_run(reference, tmp_path, mode), "1P1D")


def test_2p2d_over_vllm_serve_and_the_router(
    reference: tuple[Path, list[Prompt], list[Any]], tmp_path: Path
) -> None:
    summary = _run(reference, tmp_path, "read", prefill=2, decode=2)
    _check(summary, "2P2D")
    assert len(summary["router"]["prefill"]) == 2
    assert len(summary["router"]["decode"]) == 2


@pytest.mark.parametrize("mode", ["read", "write"])
def test_1p1d_behind_vllm_router(
    reference: tuple[Path, list[Prompt], list[Any]], tmp_path: Path, mode: str
) -> None:
    """vLLM's own Rust router (``--kv-connector moriio``), engines registering on its
    service-discovery port with the same announcement: no moriio code on the routing path."""
    if vllm_router_binary() is None:
        pytest.fail("vllm-router is not installed: scripts/setup.sh --engine installs it")
    summary = _run(reference, tmp_path, mode, router="vllm-router")
    _check(summary, "1P1D")
    assert summary["router_name"] == "vllm-router"
