"""``--vllm-bench``: vllm bench serve's arguments, its result JSON as rows, failures as rows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from moriio_tools.cli.bench_e2e import add_arguments, config_from
from moriio_tools.serve import vllm_bench
from moriio_tools.serve.vllm_bench import (
    SweepConfig,
    bench_argv,
    plot_sweep,
    render_sweep,
    row_of,
    run_sweep,
)

RESULT = {
    "completed": 16,
    "failed": 0,
    "request_throughput": 11.478,
    "request_goodput": 9.5,
    "median_ttft_ms": 82.86,
    "p99_ttft_ms": 149.37,
    "median_tpot_ms": 15.03,
    "median_itl_ms": 14.19,
    "p99_itl_ms": 107.4,
    "median_e2el_ms": 360.09,
}


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_each_level_asks_for_its_concurrency_its_seed_and_the_slos(tmp_path: Path) -> None:
    config = SweepConfig(prompts_per_level=32, goodput=("ttft:500", "tpot:50"))
    argv = bench_argv("http://h:1", "/m", 16, config, tmp_path / "r.json")
    assert _value(argv, "--max-concurrency") == "16"
    assert _value(argv, "--num-prompts") == "64"  # at least 4 x the concurrency
    assert _value(argv, "--seed") == "16"  # a level's prompts differ from another's
    assert _value(argv, "--dataset-name") == "random"
    assert _value(argv, "--percentile-metrics") == "ttft,tpot,itl,e2el"
    at = argv.index("--goodput")
    assert argv[at + 1 : at + 3] == ["ttft:500", "tpot:50"]
    assert _value(argv, "--result-filename") == "r.json"


def test_a_result_becomes_a_row() -> None:
    row = row_of("moriio-write", 4, RESULT)
    assert row["requests_per_s"] == 11.48
    assert row["goodput_per_s"] == 9.5
    assert row["ttft_ms_p50"] == 82.86
    assert row_of("x", 1, {})["itl_ms_p50"] is None


def test_a_sweep_runs_each_level_and_names_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stands in for vllm bench serve: writes the result where asked; level 4 fails.
    fake = (
        "import json, sys; a = sys.argv[1:]; c = a[a.index('--max-concurrency') + 1]\n"
        "if c == '4': sys.exit(3)\n"
        "d, f = a[a.index('--result-dir') + 1], a[a.index('--result-filename') + 1]\n"
        f"json.dump({RESULT!r}, open(d + '/' + f, 'w'))"
    )
    monkeypatch.setattr(vllm_bench, "_RUN_BENCH", fake)
    rows = run_sweep("http://h:1", "/m", "baseline", SweepConfig(concurrencies=(1, 4)), tmp_path)
    assert rows[0]["requests_per_s"] == 11.48
    assert rows[1]["error"].startswith("exit 3, see ")
    text = render_sweep(rows, ("ttft:500",))
    assert "exit 3" in text
    assert "11.48" in text
    assert plot_sweep(rows, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 0


@pytest.mark.parametrize(
    "config",
    [SweepConfig(concurrencies=()), SweepConfig(goodput=("ttft",)), SweepConfig(goodput=("x:1",))],
)
def test_bad_sweeps_are_named(config: SweepConfig) -> None:
    with pytest.raises(ValueError, match=r"concurrencies|goodput"):
        config.validate()


def test_the_command_line_builds_the_sweep() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    add_arguments(parser)
    args = parser.parse_args(
        ["--e2e", "--vllm-bench", "--concurrency", "2,8", "--goodput", "ttft:300"]
    )
    config = config_from(args)
    assert config.sweep == SweepConfig(concurrencies=(2, 8), goodput=("ttft:300",))
    assert config_from(parser.parse_args(["--e2e"])).sweep is None
    assert json.dumps(config.sweep.concurrencies) == "[2, 8]"
