"""``moriio bench --section transport`` for real: NIXL loopback figures, JSON and the plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
pytest.importorskip("nixl_cu12", reason="NIXL is not installed")


def test_transport_section_measures_nixl_against_memcpy_and_plots_the_sweep(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "moriio.cli.main",
            "bench",
            "--quick",
            "--json",
            "--section",
            "transport",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # stdout holds nothing but the JSON object
    transport = report["transport"]
    for key in ("gbps", "memcpy_gbps", "ratio", "latency_us_p50", "latency_us_p99"):
        assert transport[key] > 0, key
    assert transport["ratio"] == pytest.approx(transport["gbps"] / transport["memcpy_gbps"])
    assert transport["verified"] is True
    assert [row["block_size"] for row in transport["sweep"]] == [4096, 65536]
    assert (
        json.loads((tmp_path / "bench.json").read_text())["transport"]["gbps"]
        == (transport["gbps"])
    )
    assert (tmp_path / "transport_throughput.png").read_bytes()[:4] == b"\x89PNG"
