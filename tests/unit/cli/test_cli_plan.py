"""``moriio plan``: parsing, geometry + plan report, text and JSON output, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moriio.cli.main import main
from moriio.cli.plan import parse_block_ids, parse_ints
from moriio.domain.kv.layout import LayerSpec
from moriio.plan import contiguous_strides, dtype_itemsize, explain_plan

SEPARATED = [
    *("--shape", "2,8192,16,8,128", "--block-size", "16"),
    *("--num-kv-heads", "8", "--head-size", "128"),
]


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("float32", 4),
        ("torch.float16", 2),
        ("BFloat16", 2),
        ("uint8", 1),
        ("float8_e4m3fn", 1),
        ("fp8_e5m2", 1),
        ("float8_e5m2fnuz", 1),
    ],
)
def test_dtype_itemsize(name: str, size: int) -> None:
    assert dtype_itemsize(name) == size


def test_unknown_dtype_lists_the_known_names() -> None:
    with pytest.raises(ValueError, match=r"unknown dtype 'int4'.*bfloat16"):
        dtype_itemsize("int4")


def test_block_ids_accept_lists_and_inclusive_ranges() -> None:
    assert parse_block_ids("4,5, 9-12,", "local") == [4, 5, 9, 10, 11, 12]
    assert parse_block_ids("", "local") == []
    with pytest.raises(ValueError, match="local block ids must look like"):
        parse_block_ids("4,x", "local")
    with pytest.raises(ValueError, match="descending"):
        parse_block_ids("9-4", "remote")


def test_shape_parsing_and_contiguous_strides() -> None:
    assert parse_ints("[2, 8, 16]", "--shape") == (2, 8, 16)
    assert contiguous_strides((2, 8, 16, 4)) == (512, 64, 4, 1)
    with pytest.raises(ValueError, match="--shape must be comma-separated integers"):
        parse_ints("2,a", "--shape")


def test_explain_reports_geometry_and_coalescing() -> None:
    report = explain_plan(
        shape=(2, 8192, 16, 8, 128),
        strides=None,
        dtype="bfloat16",
        spec=LayerSpec(16, 8, 128),
        local_block_ids=[4, 5, 6],
        remote_block_ids=[10, 11, 12],
    )

    geo, plan = report["geometry"], report["plan"]
    assert geo["kind"] == "separated"
    assert geo["block_len"] == 16 * 8 * 128 * 2
    assert geo["strides_bytes"] == [8192 * 32768, 32768, 2048, 256, 2]
    assert geo["v_offset_bytes"] == geo["remote_v_offset_bytes"] == 8192 * 32768
    assert plan["descriptors"] == 2
    assert plan["total_bytes"] == 196608
    assert plan["per_block_descriptors"] == 6
    assert plan["saved_percent"] == pytest.approx(200 / 3)
    assert plan["reduction_factor"] == 3.0
    assert plan["rows"][0] == [4 * 32768, 10 * 32768, 3 * 32768]


def test_remote_v_offset_follows_the_peer_block_count() -> None:
    report = explain_plan(
        shape=(2, 16, 16, 8, 128),
        strides=None,
        dtype="bfloat16",
        spec=LayerSpec(16, 8, 128),
        local_block_ids=[1],
        remote_block_ids=[2],
        remote_num_blocks=32,
    )

    assert report["geometry"]["v_offset_bytes"] == 16 * 32768
    assert report["geometry"]["remote_v_offset_bytes"] == 32 * 32768
    assert report["plan"]["rows"][1] == [16 * 32768 + 32768, 32 * 32768 + 2 * 32768, 32768]


def test_plan_explain_prints_geometry_descriptors_and_savings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["plan", "--explain", *SEPARATED, "--local", "4-6,9", "--remote", "10-12,40", "--rows", "1"]
    )

    out = capsys.readouterr().out
    assert code == 0
    assert "kind          separated" in out
    assert "block_len     32 KiB (32768 B), 2 chunks per block (K, V)" in out
    assert "V offset      256 MiB (268435456 B) locally" in out
    assert "plan: 4 block pairs -> 4 descriptors" in out
    assert "... 3 more descriptors" in out
    assert "coalescing: 4 descriptors instead of 8 per-block copies: 50.0% fewer (2.00x)" in out


def test_plan_json_is_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--json",
            "--shape",
            "8,2,16,2,8",
            "--block-size",
            "16",
            "--dtype",
            "float16",
            "--local",
            "0-7",
            "--remote",
            "0-7",
        ]
    )

    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["geometry"]["kind"] == "interleaved"
    assert report["geometry"]["v_offset_bytes"] == 16 * 2 * 8 * 2
    assert report["plan"]["descriptors"] == 1
    assert report["plan"]["total_bytes"] == 8 * 2 * 16 * 2 * 8 * 2


def test_padded_strides_are_used(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--json",
            "--shape",
            "4,16,64",
            "--block-size",
            "16",
            "--strides",
            "2048,64,1",
            "--kind",
            "mla",
            "--dtype",
            "uint8",
            "--local",
            "0,1",
        ]
    )

    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["geometry"]["block_stride_bytes"] == 2048
    assert report["plan"]["descriptors"] == 2  # pages 1024 B apart do not coalesce


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shape", "3,8,16,8,128", "--local", "1"], "unsupported KV cache shape (3, 8, 16"),
        (["--shape", "2,8,16,8,128", "--local", "1,9"], "local block id 9 is outside [0, 8)"),
        (["--shape", "2,8,16,8,128", "--local", "1-3", "--remote", "1"], "3 local block ids"),
        (["--shape", "2,8,16,8,128", "--strides", "1,2", "--local", "1"], "differ in length"),
        (["--shape", "2,8,16,8,128", "--dtype", "int4", "--local", "1"], "unknown dtype"),
        (["--shape", "2,8,16,8,128", "--block-size", "0", "--local", "1"], "block_size must"),
    ],
)
def test_bad_input_prints_the_error_and_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if "--block-size" not in argv:
        argv = [*argv, "--block-size", "16"]
    assert main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("moriio plan: error: ")
    assert message in captured.err


def test_the_block_size_is_never_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--shape", "2,8192,16,8,128", "--local", "1"]) == 2
    assert "a layer's plan needs --block-size" in capsys.readouterr().err


SCENARIO = [
    *("--layers", "61", "--blocks", "8192", "--block-bytes", "16384"),
    *("--order", "random", "--memory", "device", "--peer", "remote"),
]


def test_a_61_layer_request_across_hosts_needs_few_descriptors_and_posts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--explain", "--json", *SCENARIO]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["per_block_descriptors"] == 61 * 8192
    assert report["path"] == "staged"
    assert report["descriptors_per_request"] <= 64
    assert report["posts_per_request"] <= 61
    by_path = {row["path"]: row for row in report["paths"]}
    assert by_path["per_layer"]["descriptors_per_request"] == 61 * 8192  # random: no runs
    assert by_path["per_layer"]["posts_per_request"] == 61
    assert by_path["request"]["posts_per_request"] == 1
    assert not by_path["same_host_copy"]["available"]
    assert report["scenario"]["total_bytes"] == 61 * 8192 * 16384


def test_a_block_outer_order_merges_each_blocks_layers_into_one_descriptor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*SCENARIO, "--page-order", "BLNHC", "--chunks-per-block", "2", "--json"]
    assert main(["plan", *argv]) == 0
    report = json.loads(capsys.readouterr().out)
    by_path = {row["path"]: row for row in report["paths"]}
    assert report["per_block_descriptors"] == 2 * 61 * 8192  # K and V apart: about a million
    assert by_path["request"]["descriptors_per_request"] == 8192


def test_without_a_staging_region_contiguous_blocks_move_as_one_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--layers", "4", "--blocks", "64", "--block-bytes", "4096", "--order", "contiguous"]
    argv += ["--memory", "host", "--peer", "local", "--staging-bytes", "0"]
    assert main(["plan", *argv]) == 0
    text = capsys.readouterr().out
    assert "chosen: request: 4 descriptors and 1 posts per request" in text
    assert "no staging region" in text


def test_a_layerwise_load_never_takes_the_request_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--json", *SCENARIO, "--layerwise", "--staging-bytes", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["path"] == "per_layer"
    assert report["posts_per_request"] == 61


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--blocks", "8"], "--blocks needs --block-bytes"),
        (["--blocks", "8", "--block-bytes", "100", "--chunks-per-block", "3"], "chunks_per_block"),
        (["--blocks", "8", "--block-bytes", "101", "--chunks-per-block", "2"], "do not split"),
        (["--blocks", "8", "--block-bytes", "64", "--cache-blocks", "4"], "cache_blocks 4"),
        (["--blocks", "0", "--block-bytes", "64"], "blocks must be a positive int"),
        (["--blocks", "8", "--block-bytes", "64", "--figures", "/nonexistent"], "--figures"),
    ],
)
def test_bad_scenarios_are_refused_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *argv]) == 2
    assert message in capsys.readouterr().err


def test_measured_figures_change_the_choice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--json", "--layers", "2", "--blocks", "256", "--block-bytes", "65536"]
    argv += ["--memory", "host", "--peer", "local"]
    assert main(["plan", *argv]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == "request"
    slow = {"host/local": {"per_descriptor": 1e-3, "per_post": 1e-5}}
    figures = tmp_path / "figures.json"
    figures.write_text(json.dumps({"figures": slow}))
    assert main(["plan", *argv, "--figures", str(figures)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["path"] == "staged"
    assert report["figures"]["source"] == str(figures)
    figures.write_text(json.dumps({"host/local": {"per_descriptor": -1}}))
    assert main(["plan", *argv, "--figures", str(figures)]) == 2
    assert "per_descriptor must be a finite number >= 0" in capsys.readouterr().err
    figures.write_text(json.dumps({"gpu/far": {}}))
    assert main(["plan", *argv, "--figures", str(figures)]) == 2
    assert "unknown figures 'gpu/far'" in capsys.readouterr().err
