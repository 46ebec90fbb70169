"""``scripts/gpu_check.sh --dry-run``: the GPU check's own plumbing, on host memory.

The same code as on a GPU machine (two processes, NIXL, fenced pushes, same-host copies timed
per post and per batch), so the check cannot rot between the runs on real hardware.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
pytest.importorskip("nixl_cu12", reason="NIXL is not installed")
pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"
CHECKS = (
    "read contiguous",
    "read random",
    "write contiguous",
    "write random",
    "same-host read random",
    "same-host write random",
    "same-host read request 61 layers",
    "same-host write request 61 layers",
    "write ordering",
    "two streams",
    "fence control",
    "layer barrier",
    "barrier control",
    "barrier stale",
    "barrier failure",
)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "MORIIO_WHEELS": "/nonexistent"}
    return subprocess.run(
        [str(SCRIPT), "--dry-run", "--mib", "4", "--rounds", "1", "--batches", "2", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


def test_the_dry_run_passes_every_check_and_prints_one_table() -> None:
    result = _run()
    assert result.returncode == 0, result.stdout + result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith(CHECKS)]
    assert [line[:34].strip() for line in table] == list(CHECKS)
    assert all(" ok " in line for line in table)
    same_host = [line for line in table if line.startswith("same-host")]
    assert all("us/post" in line and "x the contiguous copy" in line for line in same_host)
    assert "all checks passed" in result.stdout


def test_a_mismatch_fails_the_run() -> None:
    result = _run("--inject-mismatch")
    assert result.returncode == 1
    assert "MISMATCH" in result.stdout
    assert "FAILED: injected mismatch" in result.stderr
