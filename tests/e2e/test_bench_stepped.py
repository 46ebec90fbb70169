"""``moriio bench --stepped`` with tiny counts: moriio (READ, WRITE) and NixlConnector with its
progress thread off, each on a pair of engines stepped as vLLM's engine core steps them, at
vLLM's defaults (nothing bound).

Every answer must equal the plain engine's, and every decode must have loaded its prompt's
KV through the connector (vLLM's own prefill stats): an equal answer that the decode computed
itself would not count. Each pair's idle phase and cases report every engine's CPU and
wake-ups, its connector's threads among them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moriio_tools.harness import (
    STEPPED_BASELINE,
    STEPPED_CASES,
    STEPPED_CONNECTORS,
    STEPPED_PEER,
    SteppedConfig,
    run_stepped,
)
from support.prompt_kv import assert_prompt_kv_over_the_wire

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]
pytest.importorskip("nixl_cu12", reason="NIXL is not installed")


def test_every_connector_answers_equal_with_its_kv_over_the_wire(tmp_path: Path) -> None:
    binding = "vllm-defaults"
    config = SteppedConfig(
        requests=2, rounds=1, bindings=(binding,), idle_s=1.0, log_dir=str(tmp_path)
    )
    result = run_stepped(config, lambda _: None)
    runs = [r for r in result["runs"] if r["connector"] != STEPPED_BASELINE]
    assert sorted({(r["connector"], r["case"]) for r in runs}) == sorted(
        (c, case) for c in STEPPED_CONNECTORS for case in STEPPED_CASES
    )
    for run in runs:
        assert (run["equal"], run["failures"], run["loaded"]) == (2, 0, 2), f"{run}; {tmp_path}"
        assert_prompt_kv_over_the_wire(run["prompt_sources"], run["prompt_tokens"], detail=run)
        assert run["requests_per_s"] > 0
        assert len(run["ttft_s"]) == 2
        assert run["binding"] == binding
        assert set(run["usage"]) == {"prefill", "decode"}
        assert all(u["cpu"] > 0 for u in run["usage"].values()), run["usage"]
    baseline = [r for r in result["runs"] if r["connector"] == STEPPED_BASELINE]
    assert [(r["case"], r["equal"], len(r["ttft_s"])) for r in baseline] == [
        (case, 2, 2) for case in STEPPED_CASES
    ]
    idle = {e["connector"]: e["engines"] for e in result["idle"]}
    assert set(idle) == set(STEPPED_CONNECTORS)
    own_threads = {"moriio-read": "moriio-progress", "nixl-progress-off": "nixl_handshake_listener"}
    for connector, thread in own_threads.items():
        for figures in idle[connector].values():
            assert thread in {t["name"] for t in figures["threads"]}, figures
    assert list(result["summary"]) == [binding]
    for entry in result["summary"][binding]["cases"].values():
        rows, verdict = entry["connectors"], entry["verdict"]
        ours = [c for c in rows if c.startswith("moriio")]
        # The verdict names moriio's faster mode and its ratio against the peer's row.
        assert verdict["best"] == max(ours, key=lambda c: rows[c]["requests_per_s"]), entry
        ratio = rows[verdict["best"]]["requests_per_s"] / rows[STEPPED_PEER]["requests_per_s"]
        assert verdict["requests_per_s_ratio"] == pytest.approx(ratio), entry
        assert verdict["ttft_over_baseline_ms"] is not None
