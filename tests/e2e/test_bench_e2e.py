"""``moriio bench --e2e`` with tiny counts, every router sending the prefill's first token
ahead (``--first-token-ahead``).

One plain engine gives the reference outputs, then one 1P1D deployment per connector (moriio
READ and WRITE, vLLM's NixlConnector) runs two short prompts; every output must equal the
reference, token for token, the first token included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moriio_tools.harness import E2E_BASELINE, E2EConfig, SweepConfig, aggregate, run_e2e
from support.prompt_kv import assert_prompt_kv_over_the_wire

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]
pytest.importorskip("nixl_cu12", reason="NIXL is not installed")


def test_moriio_and_nixl_connector_explained_and_driven_by_vllm_bench_serve(
    tmp_path: Path,
) -> None:
    """``--explain --vllm-bench``, moriio and vLLM's NixlConnector on one baseline: every
    output equals it with the prompt KV over the wire; every READ request's first token left
    with the prefill's answer, every moriio request's KV crossed the wire (a landed load or
    push per request in the timeline), and vllm bench serve answered every prompt of each
    deployment."""
    config = E2EConfig(
        connectors=("moriio-read-async", "moriio-write", "nixl-default"),
        cases=("short-1",),
        requests=2,
        rounds=1,
        log_dir=str(tmp_path),
        prefill_limit=False,
        explain=True,
        sweep=SweepConfig(concurrencies=(2,), prompts_per_level=4, output_len=4),
        first_token_ahead=True,
    )
    result = run_e2e(config, lambda _: None)
    rows = aggregate(result["runs"])
    assert [(r["connector"], r["equal"], r["failures"]) for r in rows] == [
        (E2E_BASELINE, 2, 0),
        ("moriio-read-async", 2, 0),
        ("moriio-write", 2, 0),
        ("nixl-default", 2, 0),
    ], f"logs: {tmp_path}"
    assert rows[1]["engine_itl_ms_p50"] is not None  # scraped from the decode's /metrics
    for row in rows[1:]:
        assert_prompt_kv_over_the_wire(row["prompt_sources"], row["prompt_tokens"], detail=row)
        assert row["requests_per_s"] > 0
        assert row["ttft_ms_p50"] is not None
    explained = {e["connector"]: {s["label"]: s for s in e["stages"]} for e in result["explained"]}
    read, write = explained["moriio-read-async"], explained["moriio-write"]
    assert read["off the path: decode arrived -> landed"]["count"] == 2  # the KV came over
    assert read["first token sent ahead -> client's first token"]["count"] == 2
    assert read["client: TTFT"]["p50_ms"] > 0
    assert write["off the path: prefill scheduled -> push done"]["count"] == 2  # pushed
    # WRITE sends the token ahead only when the prefill's answer wins the race.
    assert write["client: TTFT"]["count"] == 2
    sweep = {row["connector"]: row for row in result["sweep"]}
    assert set(sweep) == {E2E_BASELINE, "moriio-read-async", "moriio-write", "nixl-default"}
    for row in sweep.values():
        assert (row.get("completed"), row.get("failed")) == (8, 0), row
        assert row["ttft_ms_p50"] > 0
