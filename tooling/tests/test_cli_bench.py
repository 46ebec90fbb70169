"""``moriio bench``: section plumbing, JSON shape, nulls with reasons, text and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from moriio.cli.main import main
from moriio_tools.bench import nixl_engine as nixl_bench_module
from moriio_tools.bench import plot as bench_plot_module
from moriio_tools.bench import render as bench_render_module
from moriio_tools.bench import suite as bench_suite_module
from moriio_tools.bench.planner import measure_planner
from moriio_tools.bench.plot import write_plots
from moriio_tools.bench.transport import measure_transport
from moriio_tools.cli import bench as bench_command
from moriio_tools.serve import e2e as e2e_module

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SCHEDULER_NULLS: dict[str, Any] = {"live_requests": 512, "series": []}
for _key in bench_suite_module.REQUIRED_KEYS["scheduler"]:
    SCHEDULER_NULLS[_key] = None
    SCHEDULER_NULLS[f"{_key}_reason"] = "vllm is not importable"


@pytest.fixture(scope="module")
def small_planner() -> dict[str, Any]:
    return measure_planner(
        num_ids=64, num_blocks=256, num_layers=5, repeat=1, round_s=0.0, use_vllm=False
    )


def test_planner_section_has_the_stable_keys_and_our_figures(
    small_planner: dict[str, Any],
) -> None:
    for key in bench_suite_module.REQUIRED_KEYS["planner"]:
        assert key in small_planner
    assert small_planner["layout"] == "separated"
    assert set(small_planner["layouts"]) == {"separated", "interleaved", "mla"}
    assert small_planner["us_per_plan"] > 0
    assert small_planner["request_61_layers_us"] > 0
    assert small_planner["naive_us_per_plan"] > 0
    separated = small_planner["layouts"]["separated"]
    assert separated["total_bytes"] == 64 * 2 * 16 * 8 * 128 * 2
    assert separated["per_block_descriptors"] == 128
    assert small_planner["layouts"]["mla"]["total_bytes"] == 64 * 16 * 576 * 2


def test_planner_without_vllm_reports_nulls_with_reasons(small_planner: dict[str, Any]) -> None:
    for key in ("vllm_us_per_plan", "speedup_vs_vllm", "vllm_request_61_layers_us"):
        assert small_planner[key] is None
        assert small_planner[f"{key}_reason"] == "skipped (--no-vllm)"
    assert small_planner["min_speedup_vs_vllm"] is None
    assert small_planner["meets_targets"] is None


def test_transport_without_nixl_is_null_with_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(**kwargs: object) -> dict[str, Any]:
        raise ImportError("NIXL is not importable")

    monkeypatch.setattr(nixl_bench_module, "run_transport_benchmark", unavailable)

    result = measure_transport()

    for key in bench_suite_module.REQUIRED_KEYS["transport"]:
        assert result[key] is None
        assert "NIXL is not importable" in result[f"{key}_reason"]
    assert result["sweep"] == []
    assert bench_render_module.render_section("transport", result).startswith(
        "transport: not measured (NIXL"
    )


def test_bench_json_prints_one_object_with_the_sections(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--json", "--quick", "--no-vllm", "--section", "planner"]) == 0

    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"moriio_version", "machine", "planner"}
    assert report["planner"]["num_ids"] == 256
    assert report["planner"]["us_per_plan"] > 0
    assert report["planner"]["speedup_vs_vllm"] is None


def test_a_section_that_raises_becomes_nulls_with_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(section: str, options: bench_suite_module.BenchOptions) -> dict[str, Any]:
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(bench_suite_module, "measure_section", boom)

    result = bench_suite_module.run_sections(("transport",), bench_suite_module.BenchOptions())

    assert result["transport"]["gbps"] is None
    assert result["transport"]["ratio_reason"] == "RuntimeError: engine exploded"


def test_text_rendering_shows_missing_figures(small_planner: dict[str, Any]) -> None:
    text = bench_render_module.render_section("planner", small_planner)

    assert "in-tree reference not measured (skipped (--no-vllm))" in text
    for layout in ("separated", "interleaved", "mla"):
        assert layout in text
    assert "least n/a: not measured" in text
    scheduler = bench_render_module.render_section("scheduler", SCHEDULER_NULLS)
    assert "n/a (vllm is not importable)" in scheduler


def _fake_result(small_planner: dict[str, Any]) -> dict[str, Any]:
    sweep = [
        {"block_size": 4096 << i, "num_blocks": 8 >> i, "gbps": 1.0 + i, "memcpy_gbps": 5.0}
        for i in range(3)
    ]
    return {
        "planner": small_planner,
        "transport": {
            "gbps": 4.0,
            "memcpy_gbps": 5.0,
            "sweep": sweep,
            "sweep_total_bytes": 1 << 20,
        },
        "scheduler": {
            "series": [
                {"live_requests": n, "us_per_step": n / 10, "vllm_us_per_step": n / 5}
                for n in (64, 256, 512)
            ]
        },
    }


def test_out_writes_json_and_plots(tmp_path: Path, small_planner: dict[str, Any]) -> None:
    written = bench_suite_module.write_outputs(_fake_result(small_planner), tmp_path / "out")

    names = sorted(p.name for p in written)
    assert names == [
        "bench.json",
        "planner_cost.png",
        "scheduler_cost.png",
        "transport_throughput.png",
    ]
    for path in written:
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == PNG_MAGIC
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["transport"]["gbps"] == 4.0


def test_no_data_no_plot(tmp_path: Path) -> None:
    assert write_plots({"scheduler": SCHEDULER_NULLS, "transport": {"sweep": []}}, tmp_path) == []


@pytest.mark.parametrize("argv", [["--e2e"], []])
def test_bench_out_without_matplotlib_stops_before_the_run(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(bench_plot_module, "find_spec", lambda name: None)

    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(e2e_module, "run_e2e", never)
    monkeypatch.setattr(bench_command, "run_sections", never)
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moriio bench: error: --out writes PNG plots with matplotlib")
    assert "pip install 'moriio[plot]'" in err
    assert not list(tmp_path.iterdir())
