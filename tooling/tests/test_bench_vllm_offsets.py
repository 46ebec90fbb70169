"""The planner benchmark's in-tree reference: vLLM's MoRIIO worker (0.32 or 0.33) moves our
bytes."""

from __future__ import annotations

import random

import pytest

from moriio.config.vllm_releases import VLLM_TORCH_PAIRS
from moriio.domain.kv.layout import describe_layout
from moriio.domain.kv.planner import plan_transfer
from moriio_tools.bench.planner import bench_layouts, dense_strides, measure_planner
from moriio_tools.bench.vllm_offsets import InTreeOffsets, canonical

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="vllm is not installed")
pytest.importorskip("torch", reason="torch is not installed")

NUM_BLOCKS = 64


@pytest.mark.parametrize("name", ["separated", "interleaved", "mla"])
def test_in_tree_offsets_cover_the_same_bytes_as_our_plan(name: str) -> None:
    layout = next(lay for lay in bench_layouts(NUM_BLOCKS) if lay.name == name)
    rng = random.Random(1)
    local = [*rng.sample(range(36), 24), 40, 41, 42]  # random ids, then a run
    remote = [*rng.sample(range(10, NUM_BLOCKS), 24), 7, 8, 9]
    geometry = describe_layout(layout.shape, dense_strides(layout.shape), 2, layout.spec)
    in_tree = InTreeOffsets(layout.in_tree, num_layers=3, remote_num_blocks=NUM_BLOCKS)

    theirs = in_tree.plan(local, remote)
    ours = plan_transfer(geometry, local, remote, NUM_BLOCKS).to_lists()

    assert in_tree.call == "MoRIIOConnectorWorker._compute_block_transfer_offsets"
    assert canonical(*ours) == canonical(*theirs)
    assert sum(theirs[2]) == 27 * geometry.block_len * geometry.transfers_per_block
    in_tree.read_request(local, remote)  # every layer computes without error


def test_planner_section_measures_the_in_tree_reference() -> None:
    result = measure_planner(num_ids=32, num_blocks=NUM_BLOCKS, num_layers=4, repeat=1, round_s=0.0)

    assert result["vllm_version"] == vllm.__version__
    assert result["vllm_version"] in VLLM_TORCH_PAIRS  # a release the connector supports
    assert result["vllm_call"] == "MoRIIOConnectorWorker._compute_block_transfer_offsets"
    for layout in result["layouts"].values():
        assert layout["same_bytes_as_vllm"] is True
        assert layout["vllm_us_per_plan"] > 0
        assert layout["speedup_vs_vllm"] == pytest.approx(
            layout["vllm_us_per_plan"] / layout["us_per_plan"]
        )
    assert result["min_speedup_vs_vllm"] is not None
    assert "speedup_vs_vllm_reason" not in result
