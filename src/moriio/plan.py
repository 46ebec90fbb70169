"""A layer's geometry and its transfer plan for given block ids, and a whole request's
paths with the one the cost model chooses, as data and as text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from moriio.domain.kv.layout import LayerGeometry, LayerSpec, describe_layout
from moriio.domain.kv.path_costs import (
    DEFAULT_FIGURES,
    DEFAULT_STAGING_BYTES,
    FIGURE_FIELDS,
    FigureKey,
    PathEstimate,
    PathFigures,
    choose_path,
    figure_name,
)
from moriio.domain.kv.planner import TransferPlan, plan_transfer
from moriio.domain.kv.scenario import Order, request_scenario
from moriio.output import fmt_bytes, format_table
from moriio.ports import MemoryKind

DTYPE_ITEMSIZE: dict[str, int] = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "int32": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "int16": 2,
    "uint8": 1,
    "int8": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
}


def dtype_itemsize(name: str) -> int:
    """Bytes per element of a dtype name (``torch.`` prefix and case ignored)."""
    key = name.strip().lower().removeprefix("torch.")
    try:
        return DTYPE_ITEMSIZE[key]
    except KeyError:
        known = ", ".join(sorted(DTYPE_ITEMSIZE))
        raise ValueError(f"unknown dtype {name!r}; known: {known}") from None


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a dense row-major tensor of ``shape``."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


PAGE_ORDERS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
"""vLLM 0.32's ``KVCacheLayout`` names: the physical order of a layer's ``[B, H, N, C]``."""


def page_order_strides(shape: Sequence[int], order: str) -> tuple[int, ...]:
    """Element strides of one layer's ``[B, H, N, C]`` view laid out in a vLLM page order
    (one layer: the ``L`` axis takes no room)."""
    if order not in PAGE_ORDERS:
        raise ValueError(f"page order must be one of {', '.join(PAGE_ORDERS)}, got {order!r}")
    if len(shape) != 4:
        raise ValueError(f"a page order needs a 4-D [B, H, N, C] shape, got {list(shape)}")
    strides = [0] * 4
    step = 1
    for axis in reversed(order.replace("L", "")):
        dim = "BHNC".index(axis)
        strides[dim] = step
        step *= shape[dim]
    return tuple(strides)


def _geometry_report(geometry: LayerGeometry, remote_num_blocks: int) -> dict[str, Any]:
    two_chunks = geometry.transfers_per_block == 2
    return {
        "kind": geometry.kind.value,
        "num_blocks": geometry.num_blocks,
        "block_size": geometry.block_size,
        "kernel_blocks_per_block": geometry.kernel_blocks_per_block,
        "block_len": geometry.block_len,
        "block_stride_bytes": geometry.block_stride_bytes,
        "strides_bytes": [s * geometry.itemsize for s in geometry.strides],
        "transfers_per_block": geometry.transfers_per_block,
        "v_offset_bytes": geometry.v_offset_bytes if two_chunks else None,
        "remote_v_offset_bytes": (
            geometry.remote_v_offset(remote_num_blocks) if two_chunks else None
        ),
        "region_len": geometry.region_len,
    }


def _plan_report(geometry: LayerGeometry, plan: TransferPlan, pairs: int) -> dict[str, Any]:
    per_block = pairs * geometry.transfers_per_block
    n = plan.num_descriptors
    local, remote, sizes = plan.to_lists()
    return {
        "pairs": pairs,
        "descriptors": n,
        "total_bytes": plan.total_bytes,
        "per_block_descriptors": per_block,
        "saved_descriptors": per_block - n,
        "saved_percent": 100.0 * (per_block - n) / per_block if per_block else 0.0,
        "reduction_factor": per_block / n if n else None,
        "rows": [list(row) for row in zip(local, remote, sizes, strict=True)],
    }


def explain_plan(
    *,
    shape: Sequence[int],
    strides: Sequence[int] | None,
    dtype: str,
    spec: LayerSpec,
    local_block_ids: Sequence[int],
    remote_block_ids: Sequence[int] | None = None,
    remote_num_blocks: int | None = None,
    page_order: str | None = None,
) -> dict[str, Any]:
    """Geometry + plan as one plain dict; ValueError names whatever is wrong with the input.

    ``strides`` default to ``page_order``'s (a vLLM 0.32 ``[B, H, N, C]`` view), else to a
    contiguous tensor; ``remote_block_ids`` to the local ids and ``remote_num_blocks`` to
    the local block count.
    """
    itemsize = dtype_itemsize(dtype)
    shp = tuple(shape)
    if strides is not None:
        std = tuple(strides)
    elif page_order is not None:
        std = page_order_strides(shp, page_order)
    else:
        std = contiguous_strides(shp)
    geometry = describe_layout(shp, std, itemsize, spec)
    remote = list(local_block_ids) if remote_block_ids is None else list(remote_block_ids)
    peer_blocks = geometry.num_blocks if remote_num_blocks is None else remote_num_blocks
    plan = plan_transfer(geometry, list(local_block_ids), remote, peer_blocks)
    return {
        "layout": {
            "shape": list(shp),
            "strides": list(std),
            "dtype": dtype,
            "itemsize": itemsize,
            "page_order": page_order,
            "spec": {
                "block_size": spec.block_size,
                "num_kv_heads": spec.num_kv_heads,
                "head_size": spec.head_size,
                "head_size_v": spec.head_size_v,
                "kind": spec.kind,
                "num_states": spec.states_per_block,
                "content_bytes": spec.content_bytes,
            },
            "remote_num_blocks": peer_blocks,
        },
        "geometry": _geometry_report(geometry, peer_blocks),
        "plan": _plan_report(geometry, plan, len(local_block_ids)),
    }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _sized(n: int) -> str:
    return f"{fmt_bytes(n)} ({n} B)" if n >= 1024 else f"{n} B"


def render_explain(report: dict[str, Any], *, rows: int = 10) -> str:
    """Human-readable geometry + plan."""
    lay, geo, plan = report["layout"], report["geometry"], report["plan"]
    chunks = (
        "2 chunks per block (K, V)"
        if geo["transfers_per_block"] == 2
        else "1 chunk per block (the whole page)"
    )
    if geo["v_offset_bytes"] is None:
        v_line = "none (K and V move together)"
    else:
        v_line = (
            f"{_sized(geo['v_offset_bytes'])} locally, {_sized(geo['remote_v_offset_bytes'])} "
            f"on the peer (remote_num_blocks={lay['remote_num_blocks']})"
        )
    kernel = geo["kernel_blocks_per_block"]
    lines = [
        "geometry",
        f"  kind          {geo['kind']}",
        f"  tensor        shape {lay['shape']} {lay['dtype']} ({lay['itemsize']} B/element)",
        f"  strides       {geo['strides_bytes']} bytes (elements: {lay['strides']})"
        + (f", page order {lay['page_order']}" if lay["page_order"] else ""),
        f"  blocks        {geo['num_blocks']} x {geo['block_size']} tokens"
        + (f" ({kernel} kernel blocks each)" if kernel > 1 else ""),
        f"  block_len     {_sized(geo['block_len'])}, {chunks}",
        f"  block stride  {_sized(geo['block_stride_bytes'])}",
        f"  V offset      {v_line}",
        f"  region        {_sized(geo['region_len'])}",
        "",
        render_summary(report),
    ]
    shown = plan["rows"][: max(rows, 0)]
    if shown:
        table = format_table(
            ["#", "local_offset", "remote_offset", "size"],
            [[i, lo, ro, sz] for i, (lo, ro, sz) in enumerate(shown)],
            right=(0, 1, 2, 3),
        )
        lines.append("  " + table.replace("\n", "\n  "))
        if len(shown) < plan["descriptors"]:
            lines.append(f"  ... {plan['descriptors'] - len(shown)} more descriptors")
    lines.append(render_savings(report))
    return "\n".join(lines)


def render_summary(report: dict[str, Any]) -> str:
    plan = report["plan"]
    return (
        f"plan: {_count(plan['pairs'], 'block pair')} -> "
        f"{_count(plan['descriptors'], 'descriptor')}, "
        f"{_sized(plan['total_bytes'])}"
    )


def render_savings(report: dict[str, Any]) -> str:
    plan = report["plan"]
    if not plan["per_block_descriptors"]:
        return "coalescing: nothing to move (empty plan)"
    return (
        f"coalescing: {_count(plan['descriptors'], 'descriptor')} instead of "
        f"{plan['per_block_descriptors']} per-block copies: "
        f"{plan['saved_percent']:.1f}% fewer ({plan['reduction_factor']:.2f}x)"
    )


def explain_paths(
    *,
    layers: int,
    blocks: int,
    block_bytes: int,
    memory: MemoryKind,
    same_host: bool,
    order: Order = "random",
    block_outer: bool = False,
    chunks_per_block: int = 1,
    cache_blocks: int | None = None,
    staging_bytes: int = DEFAULT_STAGING_BYTES,
    layerwise: bool = False,
    same_host_copies: bool = True,
    figures: Mapping[FigureKey, PathFigures] | None = None,
) -> dict[str, Any]:
    """A request of ``layers`` x ``blocks`` blocks planned for real, every path's estimate and
    the one the cost model chooses, as one plain dict (ValueError names a bad argument)."""
    scenario = request_scenario(
        layers=layers,
        blocks=blocks,
        block_bytes=block_bytes,
        memory=memory,
        same_host=same_host,
        order=order,
        block_outer=block_outer,
        chunks_per_block=chunks_per_block,
        cache_blocks=cache_blocks,
        staging_bytes=staging_bytes,
        layerwise=layerwise,
        same_host_copies=same_host_copies,
    )
    key = (memory, same_host)
    figs = (figures or DEFAULT_FIGURES)[key]
    choice = choose_path(scenario, figs)

    def row(estimate: PathEstimate) -> dict[str, Any]:
        return {
            "path": estimate.path.value,
            "descriptors_per_request": estimate.descriptors,
            "posts_per_request": estimate.posts,
            "copied_bytes": estimate.copied_bytes,
            "estimated_seconds": estimate.seconds,
            "available": estimate.available,
            "reason": estimate.reason,
        }

    chosen = row(choice.chosen)
    return {
        "scenario": {
            "layers": layers,
            "blocks": blocks,
            "block_bytes": block_bytes,
            "chunks_per_block": chunks_per_block,
            "order": order,
            "page_order": "block_outer" if block_outer else "layer_outer",
            "memory": memory.value,
            "peer": "local" if same_host else "remote",
            "staging_bytes": staging_bytes,
            "layerwise": layerwise,
            "total_bytes": scenario.total_bytes,
        },
        "figures": {
            "name": figure_name(key),
            "source": figs.source,
            **{name: getattr(figs, name) for name in FIGURE_FIELDS},
        },
        "path": chosen["path"],
        "descriptors_per_request": chosen["descriptors_per_request"],
        "posts_per_request": chosen["posts_per_request"],
        "estimated_seconds": chosen["estimated_seconds"],
        "per_block_descriptors": scenario.layers * scenario.pieces_per_layer,
        "paths": [row(e) for e in choice.estimates],
    }


def render_paths(report: dict[str, Any]) -> str:
    """Human-readable scenario, every path's estimate and the chosen one."""
    sc, figs = report["scenario"], report["figures"]
    rows = [
        [
            ("* " if p["path"] == report["path"] else "  ") + p["path"],
            p["descriptors_per_request"],
            p["posts_per_request"],
            fmt_bytes(p["copied_bytes"]),
            f"{p['estimated_seconds'] * 1e3:.2f}",
            p["reason"] or "",
        ]
        for p in report["paths"]
    ]
    table = format_table(
        ["path", "descriptors", "posts", "copied", "est. ms", "not available because"],
        rows,
        right=(1, 2, 4),
    )
    return "\n".join(
        [
            f"request: {sc['layers']} layers x {sc['blocks']} blocks of "
            f"{_sized(sc['block_bytes'])} ({sc['chunks_per_block']} chunk(s) each), "
            f"{sc['order']} order, {sc['page_order'].replace('_', '-')} pages, "
            f"{sc['memory']} memory, {sc['peer']} peer: {_sized(sc['total_bytes'])}",
            f"figures: {figs['name']} ({figs['source']}); staging region "
            + (_sized(sc["staging_bytes"]) if sc["staging_bytes"] else "none"),
            "",
            "  " + table.replace("\n", "\n  "),
            "",
            f"chosen: {report['path']}: {report['descriptors_per_request']} descriptors and "
            f"{report['posts_per_request']} posts per request (the per-block path: "
            f"{report['per_block_descriptors']} descriptors)",
        ]
    )
