"""``moriio plan`` between TP sizes: which heads move, where they lie, and the descriptors."""

from __future__ import annotations

import json

import pytest

from moriio.cli.main import main

SPLIT = [
    *("plan", "--block-size", "16", "--total-kv-heads", "8", "--local", "4-6,9"),
    *("--remote", "10-12,40", "--dtype", "bfloat16"),
]


def test_split_heads_of_hnd_pages_move_as_one_descriptor_per_block(
    capsys: pytest.CaptureFixture[str],
) -> None:
    view = ("--shape", "64,4,16,256", "--page-order", "LBHNC")
    code = main([*SPLIT, *view, "--explain", "--tp", "2", "--rank", "1", "--peer-tp", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "this rank     TP 2 rank 1: heads 4-7" in out
    assert "peer rank     TP 1 rank 0: heads 0-7 (view [64, 8, 16, 256])" in out
    assert "moved         heads 4-7" in out
    assert "plan: 4 block pairs -> 4 descriptors (1 per block, not 256" in out


def test_gathering_from_a_larger_tp_names_each_peer_ranks_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    view = ("--shape", "64,8,16,256", "--page-order", "LBNHC")
    code = main([*SPLIT, *view, "--json", "--peer-tp", "2", "--peer-rank", "1"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["heads"]["moved"] == [4, 5, 6, 7]
    assert report["plan"]["descriptors"] == 4 * 16  # NHD: one run of 4 heads per token
    assert report["plan"]["total_bytes"] == 4 * 4 * 16 * 256 * 2


def test_split_without_the_models_head_count_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--shape", "64,4,16,256", "--block-size", "16", "--local", "1"]
    assert main([*args, "--peer-tp", "2"]) == 2
    assert "--total-kv-heads and --local are needed" in capsys.readouterr().err
