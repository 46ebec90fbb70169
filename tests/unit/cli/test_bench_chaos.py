"""`moriio bench --chaos` runs seeded simulations and reports faults and violations."""

import json

import pytest

from moriio.cli.main import main


def test_chaos_reports_runs_faults_and_zero_violations(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--chaos", "--seeds", "6", "--workers", "1", "--json"])
    data = json.loads(capsys.readouterr().out)["chaos"]
    assert code == 0
    assert data["runs"] == 6
    assert data["requests"] == 600
    assert data["faults_injected"] == sum(data["faults"].values()) > 0
    assert data["invariant_violations"] == 0
    assert data["runs_by_mode"] == {"read": 3, "write": 3}
