"""KV heads split across TP ranks, moved byte for byte in every page layout vLLM 0.32 hands a
connector, against vLLM's own per-head views of its sharded caches.

Each row builds the caches as vLLM does (see :mod:`support.kv_views`) for TP 1 (every KV
head) and for each rank of a larger TP size (its heads, the spec the backend publishes for
that many). A head is read the way the backend's kernels read it: the view's head slot
(packed pages), ``_nvfp4_kv_views`` (FlashInfer's NVFP4 pages, K and V data and scales
apart; its source is run from vLLM's file, flashinfer itself is not installed here),
``PagedAttention.split_kv_cache`` (``rocm_attn``'s K and V planes, heads as tiles) or B12X's
``unbind`` + ``unflatten`` (heads in each state's row). The plan comes from the domain's
planner (``SlicedPlans``), once as the consumer plans a READ and once as the producer plans a
WRITE; after applying it the destination's bytes must equal vLLM's per-head copy exactly,
every other byte untouched.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from vllm.utils.torch_utils import nvfp4_split_data_scale
from vllm.v1.attention.ops.paged_attn import PagedAttention
from vllm.v1.kv_cache_interface import FullAttentionSpec

from moriio.domain.kv.head_slices import SliceLayout
from moriio.domain.kv.layout import LayerGeometry, describe_layout
from moriio.domain.kv.planner import plan_transfer
from moriio.domain.kv.slice_layouts import HeadOrder
from moriio.domain.kv.slice_plans import RankPair, SlicedPlans
from moriio.vllm_plugin.kv_views import to_layer_spec
from moriio.vllm_plugin.tp_slicing import head_order
from support.kv_views import LOCAL_BLOCKS, REMOTE_BLOCKS, ROWS, Row, views

PAIRS = [(4, 8), (0, 2), (5, 0), (1, 1)]  # (consumer block, producer block)
# view, KV heads -> per head, its parts as views whose first axis runs over kernel blocks
HeadReader = Callable[[torch.Tensor, int], list[list[torch.Tensor]]]


def _nvfp4_kv_views() -> Callable[..., object]:
    """FlashInfer's ``_nvfp4_kv_views``, run from vLLM's source file."""
    spec = importlib.util.find_spec("vllm.v1.attention.backends.flashinfer")
    assert spec is not None
    assert spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    (node,) = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_nvfp4_kv_views"
    ]
    namespace: dict[str, object] = {
        "torch": torch,
        "nvfp4_split_data_scale": nvfp4_split_data_scale,
        "_KVPair": tuple,
    }
    exec(compile(ast.Module([node], []), spec.origin, "exec"), namespace)
    return namespace["_nvfp4_kv_views"]  # type: ignore[return-value]


NVFP4_VIEWS = _nvfp4_kv_views()


def _slots(view: torch.Tensor, heads: int) -> list[list[torch.Tensor]]:
    return [[view[:, h]] for h in range(heads)]


def _nvfp4(view: torch.Tensor, heads: int) -> list[list[torch.Tensor]]:
    (k, v), (ks, vs), order = NVFP4_VIEWS(view, heads)  # type: ignore[misc]
    axis = 1 if order == "HND" else 2
    parts = [k, v, ks.view(torch.uint8), vs.view(torch.uint8)]
    return [[p.select(axis, h) for p in parts] for h in range(heads)]


def _tiles(view: torch.Tensor, heads: int, size: int) -> list[list[torch.Tensor]]:
    key, value = PagedAttention.split_kv_cache(view.transpose(0, 1), heads, size)
    return [[key[:, h], value[:, h]] for h in range(heads)]


def _rows(view: torch.Tensor, heads: int) -> list[list[torch.Tensor]]:
    key, value = view.unbind(1)
    key, value = key.unflatten(-1, (heads, -1)), value.unflatten(-1, (heads, -1))
    return [[key[:, :, h], value[:, :, h]] for h in range(heads)]


B12X_ROWS = "BHLNC, two head slots, two layers (B12X rows)"
# row -> (the backend that produces it, how a head of it is read)
CASES: dict[str, tuple[str, HeadReader | None]] = {
    "flash_attn bf16 LBNHC": ("FLASH_ATTN", _slots),
    "flash_attn fp8 LBNHC": ("FLASH_ATTN", _slots),
    "flash_attn block 64 on kernel blocks of 16": ("FLASH_ATTN", _slots),
    "flashinfer HND (SM100) LBHNC": ("FLASHINFER", _slots),
    "flashinfer nvfp4 LBHNC": ("FLASHINFER", _nvfp4),
    "triton int8 per-token-head": ("TRITON_ATTN", _slots),
    "triton int4 per-token-head": ("TRITON_ATTN", _slots),
    "aiter_fa LBHNC": ("FLASH_ATTN", _slots),
    "aiter_fa block 64 on kernel blocks of 32": ("FLASH_ATTN", _slots),
    "aiter_fa shuffle: 2 head slots, C = H*D, LHBNC": ("FLASH_ATTN", None),
    "rocm_attn: K plane and V plane, LHBNC": ("ROCM_ATTN", None),
    "aiter_unified LBHNC": ("ROCM_AITER_UNIFIED_ATTN", _slots),
    "cpu_attn fp32 LBHNC": ("CPU_ATTN", _slots),
    "cpu_attn fp8_e5m2 LBHNC": ("CPU_ATTN", _slots),
    "BLHNC, two layers per block": ("FLASHINFER", _slots),
    "BHLNC, two head slots, two layers": ("ROCM_ATTN", None),
    B12X_ROWS: ("B12X", _rows),
}
ROWS_USED = {
    **ROWS,
    B12X_ROWS: ROWS["BHLNC, two head slots, two layers"],
}


def _reader(name: str, spec: FullAttentionSpec) -> HeadReader:
    reader = CASES[name][1]
    if reader is None:  # K/V planes of head tiles: rocm_attn's split_kv_cache reads them
        return lambda view, heads: _tiles(view, heads, spec.head_size)
    return reader


def _sharded(spec: FullAttentionSpec, tp: int) -> FullAttentionSpec:
    """The spec a backend publishes for one rank of ``tp``: its share of the KV heads, head
    slots and (when heads are folded into the content) content bytes."""
    heads = spec.num_kv_heads // tp
    slots = spec.num_head_slots
    content = spec.state_content_bytes
    if slots == 2 and content is not None:  # K/V planes of C = heads * D
        content = content // tp
    elif slots is not None and slots != 2:
        slots = slots // tp
    return replace(spec, num_kv_heads=heads, num_head_slots=slots, state_content_bytes=content)


def _row(name: str, tp: int) -> Row:
    row = ROWS_USED[name]
    return replace(row, specs=tuple(_sharded(s, tp) for s in row.specs))  # type: ignore[arg-type]


def _geometry(spec: FullAttentionSpec, view: torch.Tensor) -> LayerGeometry:
    shape, strides = tuple(view.shape), tuple(view.stride())
    return describe_layout(shape, strides, view.element_size(), to_layer_spec(spec))


def _layout(name: str, spec: FullAttentionSpec, geometry: LayerGeometry, tp: int) -> SliceLayout:
    order = head_order(spec, CASES[name][0])
    assert isinstance(order, HeadOrder), order
    total = ROWS_USED[name].specs[0].num_kv_heads  # type: ignore[attr-defined]
    from moriio.domain.kv.slice_layouts import head_slices

    return head_slices(geometry, order, total, tp)


def _blocks(part: torch.Tensor, k: int, block: int) -> torch.Tensor:
    """Logical block ``block`` (its ``k`` kernel blocks) of a per-head view."""
    return part.narrow(0, block * k, k)


def _tp_pairs() -> list[tuple[str, int, int]]:
    """Every row between TP 1 and 2 both ways; rows of 4 KV heads or more also 2 <-> 4."""
    pairs = []
    for name in CASES:
        pairs += [(name, 2, 1), (name, 1, 2)]
        if ROWS_USED[name].specs[0].num_kv_heads >= 4:  # type: ignore[attr-defined]
            pairs += [(name, 4, 2), (name, 2, 4)]
    return pairs


@pytest.mark.parametrize("planner", ["consumer (READ)", "producer (WRITE)"])
@pytest.mark.parametrize(("name", "consumer_tp", "producer_tp"), _tp_pairs())
def test_split_heads_move_like_vllms_own_per_head_copy(
    name: str, consumer_tp: int, producer_tp: int, planner: str
) -> None:
    consumers = [views(_row(name, consumer_tp), LOCAL_BLOCKS) for _ in range(consumer_tp)]
    producers = [
        views(_row(name, producer_tp), REMOTE_BLOCKS, _random(name, producer_tp, p))
        for p in range(producer_tp)
    ]
    expected = [views(_row(name, consumer_tp), LOCAL_BLOCKS, raw.clone()) for raw, _ in consumers]
    got = [raw.clone().view(torch.uint8).numpy() for raw, _ in consumers]
    total = ROWS_USED[name].specs[0].num_kv_heads  # type: ignore[attr-defined]
    for c, ((c_raw, c_views), (e_raw, e_views)) in enumerate(zip(consumers, expected, strict=True)):
        for p, (p_raw, p_views) in enumerate(producers):
            for (spec_c, view_c), (spec_p, view_p), (_, view_e) in zip(
                c_views, p_views, e_views, strict=True
            ):
                g_c, g_p = _geometry(spec_c, view_c), _geometry(spec_p, view_p)
                l_c = _layout(name, spec_c, g_c, consumer_tp)
                l_p = _layout(name, spec_p, g_p, producer_tp)
                if planner.startswith("consumer"):
                    plans = SlicedPlans(
                        [a for a, _ in PAIRS], [b for _, b in PAIRS], (), REMOTE_BLOCKS,
                        RankPair(c, consumer_tp, p, producer_tp, local_consumes=True),
                    )  # fmt: skip
                    plan = plans.plan_for(
                        "layer", g_c, (l_c,), (l_p,), g_p.block_len, g_p.block_stride_bytes
                    )
                    dst_off, src_off = plan.local_offsets, plan.remote_offsets
                else:
                    plans = SlicedPlans(
                        [b for _, b in PAIRS], [a for a, _ in PAIRS], (), LOCAL_BLOCKS,
                        RankPair(p, producer_tp, c, consumer_tp, local_consumes=False),
                    )  # fmt: skip
                    plan = plans.plan_for(
                        "layer", g_p, (l_p,), (l_c,), g_c.block_len, g_c.block_stride_bytes
                    )
                    dst_off, src_off = plan.remote_offsets, plan.local_offsets
                base_c = view_c.data_ptr() - c_raw.data_ptr()
                base_p = view_p.data_ptr() - p_raw.data_ptr()
                src = p_raw.view(torch.uint8).numpy()
                for d, s, n in zip(
                    dst_off.tolist(), src_off.tolist(), plan.sizes.tolist(), strict=True
                ):
                    got[c][base_c + d : base_c + d + n] = src[base_p + s : base_p + s + n]
                # vLLM's own per-head views: the heads both ranks hold, block by block
                read = _reader(name, spec_c)
                heads_c, heads_p = spec_c.num_kv_heads, spec_p.num_kv_heads
                first_c, first_p = c * heads_c, p * heads_p
                k = g_c.kernel_blocks_per_block
                mine, theirs = read(view_e, heads_c), read(view_p, heads_p)
                for h in range(max(first_c, first_p), min(first_c + heads_c, first_p + heads_p)):
                    for lb, rb in PAIRS:
                        for ours, peer in zip(mine[h - first_c], theirs[h - first_p], strict=True):
                            _blocks(ours, k, lb).copy_(_blocks(peer, k, rb))
        assert total >= 2
        assert np.array_equal(got[c], e_raw.view(torch.uint8).numpy()), f"{name}: rank {c}"
        assert not np.array_equal(got[c], c_raw.view(torch.uint8).numpy())


def _random(name: str, tp: int, rank: int) -> torch.Tensor:
    """Random bytes for a producer rank's whole buffer (views() sizes it)."""
    raw, _ = views(_row(name, tp), REMOTE_BLOCKS)
    rng = np.random.default_rng(1000 + 10 * tp + rank)
    return torch.from_numpy(rng.integers(-128, 128, raw.numel(), dtype=np.int8))


def test_split_heads_in_hnd_pages_move_as_one_descriptor_per_block() -> None:
    """A rank's heads lie together in an HND page: one descriptor per block, not one per
    head; in an NHD page one per state (token); the planner never multiplies by heads."""
    counts = {}
    for name in (
        "cpu_attn fp32 LBHNC",
        "flash_attn bf16 LBNHC",
        "aiter_fa block 64 on kernel blocks of 32",
    ):
        (_, ((spec_c, view_c),)), (_, ((spec_p, view_p),)) = (
            views(_row(name, 2), LOCAL_BLOCKS),
            views(_row(name, 1), REMOTE_BLOCKS),
        )
        g_c, g_p = _geometry(spec_c, view_c), _geometry(spec_p, view_p)
        plans = SlicedPlans([0, 1, 2], [3, 4, 5], (), REMOTE_BLOCKS, RankPair(1, 2, 0, 1, True))
        plan = plans.plan_for(
            "l", g_c, (_layout(name, spec_c, g_c, 2),), (_layout(name, spec_p, g_p, 1),),
            g_p.block_len, g_p.block_stride_bytes,
        )  # fmt: skip
        counts[name] = plan.num_descriptors
    assert counts["cpu_attn fp32 LBHNC"] == 3  # 3 blocks
    assert counts["flash_attn bf16 LBNHC"] == 3 * 16  # a run per token of each block
    assert counts["aiter_fa block 64 on kernel blocks of 32"] == 3 * 2  # per kernel block


def test_mla_pages_move_whole_between_tp_sizes_from_the_first_producer_rank() -> None:
    row = ROWS["flashmla bf16 block 64"]
    (_, ((spec, local),)), (_, ((_, remote),)) = (
        views(row, LOCAL_BLOCKS),
        views(row, REMOTE_BLOCKS),
    )
    assert head_order(spec, "FLASHMLA") is None
    g_l, g_r = _geometry(spec, local), _geometry(spec, remote)  # type: ignore[arg-type]
    ids = ([a for a, _ in PAIRS], [b for _, b in PAIRS])
    whole = plan_transfer(g_l, *ids, REMOTE_BLOCKS, g_r.block_stride_bytes)
    first = SlicedPlans(*ids, (), REMOTE_BLOCKS, RankPair(0, 1, 0, 2, True))
    second = SlicedPlans(*ids, (), REMOTE_BLOCKS, RankPair(0, 1, 1, 2, True))
    args = ("l", g_l, (None,), (None,), g_r.block_len, g_r.block_stride_bytes)
    assert first.plan_for(*args).to_lists() == whole.to_lists()
    assert second.plan_for(*args).num_descriptors == 0  # replicated: moved once
