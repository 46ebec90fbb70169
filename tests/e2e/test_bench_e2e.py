"""``moriio bench --e2e`` with tiny counts: vLLM's NixlConnector behind the NIXL proxy.

One plain engine gives the reference outputs, then one 1P1D NixlConnector deployment runs
two short prompts 4 in flight; every output must equal the reference, token for token.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moriio.tools.serve.e2e import E2EConfig, run_e2e
from moriio.tools.serve.e2e_report import BASELINE, aggregate

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]
pytest.importorskip("nixl_cu12", reason="NIXL is not installed")


def test_nixl_connector_outputs_equal_the_baseline(tmp_path: Path) -> None:
    config = E2EConfig(
        connectors=("nixl-default",),
        cases=("short-4",),
        requests=2,
        rounds=1,
        log_dir=str(tmp_path),
        prefill_limit=False,  # one engine start less: the report's ratio is unit-tested
    )
    rows = aggregate(run_e2e(config, lambda _: None)["runs"])
    assert [(r["connector"], r["case"]) for r in rows] == [
        (BASELINE, "short-4"),
        ("nixl-default", "short-4"),
    ]
    nixl = rows[1]
    assert (nixl["equal"], nixl["failures"]) == (2, 0), f"logs: {tmp_path}"
    assert nixl["requests_per_s"] > 0
    assert nixl["ttft_ms_p50"] is not None
