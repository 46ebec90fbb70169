"""Planner benchmark: our plan vs vLLM's in-tree MoRIIO offsets vs a naive loop, one run.

:func:`measure_planner` plans 2048 random block ids (Python int lists, as vLLM passes them;
the remote ids an independent sample) on separated, interleaved and MLA layouts, and times a
61-layer READ request: ours builds one :class:`PlanCache` and asks it for every layer (one
plan, 60 hits); the in-tree worker recomputes the offsets for every layer. Timings are
medians of ``repeat`` rounds (each at least ``round_s``). :func:`run_planner_benchmark` is
the single-layout variant behind ``benchmarks/bench_planner.py``.
"""

from __future__ import annotations

import random
import statistics
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moriio.domain.kv.layout import LayerGeometry, LayerSpec, describe_layout
from moriio.domain.kv.plan_cache import PlanCache
from moriio.domain.kv.planner import plan_transfer, plan_transfer_naive
from moriio.domain.kv.request_plan import Placement, RequestBatch, RequestLayer, plan_request
from moriio_tools.bench.vllm_offsets import InTreeLayout, InTreeOffsets, canonical, vllm_version

TARGET_SPEEDUP_VS_VLLM = 10.0
TARGET_REQUEST_SPEEDUP_VS_VLLM = 200.0
HEADLINE_LAYOUT = "separated"

# Legacy targets of benchmarks/bench_planner.py.
TARGET_PLAN_US = 130.0
TARGET_SPEEDUP = 15.0
TARGET_CACHED_US = 2.0


@dataclass(frozen=True, slots=True)
class BenchLayout:
    """A layout in our terms (shape, spec) and in vLLM's (tensor shape, spec class)."""

    name: str
    shape: tuple[int, ...]
    spec: LayerSpec
    in_tree: InTreeLayout


def bench_layouts(num_blocks: int) -> tuple[BenchLayout, ...]:
    """bf16 separated ``[2, nb, 16, 8, 128]``, interleaved ``[nb, 2, 16, 8, 128]`` and MLA
    ``[nb, 16, 576]`` (vLLM: ``[nb, 1, 16, 576]``, the same bytes)."""
    nb = num_blocks
    attn = LayerSpec(16, 8, 128)
    return (
        BenchLayout(
            "separated",
            (2, nb, 16, 8, 128),
            attn,
            InTreeLayout((2, nb, 16, 8, 128), "bfloat16", 16, 8, 128),
        ),
        BenchLayout(
            "interleaved",
            (nb, 2, 16, 8, 128),
            attn,
            InTreeLayout((nb, 2, 16, 8, 128), "bfloat16", 16, 8, 128),
        ),
        BenchLayout(
            "mla",
            (nb, 16, 576),
            LayerSpec(16, 1, 576, "mla"),
            InTreeLayout((nb, 1, 16, 576), "bfloat16", 16, 1, 576, mla=True),
        ),
    )


def dense_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def time_us(fn: Callable[[], object], *, repeat: int, round_s: float = 0.02) -> float:
    """Median microseconds per call over ``repeat`` rounds of at least ``round_s`` each."""
    timer = timeit.Timer(fn)
    number, elapsed = 1, timer.timeit(1)
    while elapsed < round_s:
        number = max(number * 2, int(number * round_s / max(elapsed, 1e-9)) + 1)
        elapsed = timer.timeit(number)
    rounds = [elapsed, *timer.repeat(repeat=max(repeat - 1, 0), number=number)]
    return statistics.median(rounds) / number * 1e6


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den


def _set_null(result: dict[str, Any], key: str, reason: str) -> None:
    result[key] = None
    result[f"{key}_reason"] = reason


_VLLM_KEYS = (
    "vllm_us_per_plan",
    "speedup_vs_vllm",
    "vllm_request_61_layers_us",
    "request_61_layers_speedup_vs_vllm",
)


def _measure_layout(
    layout: BenchLayout,
    local: list[int],
    remote: list[int],
    *,
    num_blocks: int,
    num_layers: int,
    repeat: int,
    round_s: float,
    use_vllm: bool,
) -> tuple[dict[str, Any], str | None]:
    """Figures for one layout, and the in-tree call used (None when not measured)."""
    strides = dense_strides(layout.shape)
    geometries: list[LayerGeometry] = [
        describe_layout(layout.shape, strides, 2, layout.spec) for _ in range(num_layers)
    ]
    geo = geometries[0]
    plan = plan_transfer(geo, local, remote, num_blocks)
    naive = plan_transfer_naive(geo, local, remote, num_blocks)
    if canonical(*plan.to_lists()) != naive:
        raise AssertionError(f"{layout.name}: our plan and the naive loop move different bytes")

    def request() -> None:
        cache = PlanCache(local, remote, num_blocks)
        for g in geometries:
            cache.plan_for(g)

    extent = geo.region_len
    places = [Placement(0, i * extent) for i in range(num_layers)]
    spanned = [
        RequestLayer(f"layer{i}", g, num_blocks, None, p, p)
        for i, (g, p) in enumerate(zip(geometries, places, strict=True))
    ]

    def request_batch() -> tuple[RequestBatch, ...]:
        return plan_request(spanned, local, remote)

    def naive_request() -> None:
        for g in geometries:
            plan_transfer_naive(g, local, remote, num_blocks)

    def timed(fn: Callable[[], object]) -> float:
        return time_us(fn, repeat=repeat, round_s=round_s)

    us = timed(lambda: plan_transfer(geo, local, remote, num_blocks))
    naive_us = timed(lambda: plan_transfer_naive(geo, local, remote, num_blocks))
    request_us = timed(request)
    (batch,) = request_batch()
    batch_us = timed(request_batch)
    naive_request_us = time_us(naive_request, repeat=max(3, repeat // 2), round_s=0.0)
    warm = PlanCache(local, remote, num_blocks)
    warm.plan_for(geo)
    result: dict[str, Any] = {
        "shape": list(layout.shape),
        "vllm_shape": list(layout.in_tree.shape),
        "dtype": "bfloat16",
        "kind": geo.kind.value,
        "descriptors": plan.num_descriptors,
        "per_block_descriptors": len(local) * geo.transfers_per_block,
        "total_bytes": plan.total_bytes,
        "us_per_plan": us,
        "naive_us_per_plan": naive_us,
        "speedup_vs_naive": _ratio(naive_us, us),
        "cached_lookup_us": timed(lambda: warm.plan_for(geometries[-1])),
        "request_61_layers_us": request_us,
        "naive_request_61_layers_us": naive_request_us,
        "request_61_layers_speedup_vs_naive": _ratio(naive_request_us, request_us),
        # The same request as one batch between two buffers (spans): shifted, merged.
        "request_batch_61_layers_us": batch_us,
        "request_batch_descriptors": batch.plan.num_descriptors,
    }
    if not use_vllm:
        for key in _VLLM_KEYS:
            _set_null(result, key, "skipped (--no-vllm)")
        return result, None
    try:
        in_tree = InTreeOffsets(layout.in_tree, num_layers, num_blocks)
    except ImportError as exc:
        for key in _VLLM_KEYS:
            _set_null(result, key, str(exc))
        return result, None
    theirs = in_tree.plan(local, remote)
    result["vllm_descriptors"] = len(theirs[0])
    result["same_bytes_as_vllm"] = canonical(*plan.to_lists()) == canonical(*theirs)
    vllm_us = timed(lambda: in_tree.plan(local, remote))
    vllm_request_us = time_us(
        lambda: in_tree.read_request(local, remote), repeat=max(3, repeat // 2), round_s=0.0
    )
    result["vllm_us_per_plan"] = vllm_us
    result["speedup_vs_vllm"] = _ratio(vllm_us, us)
    result["vllm_request_61_layers_us"] = vllm_request_us
    result["request_61_layers_speedup_vs_vllm"] = _ratio(vllm_request_us, request_us)
    return result, in_tree.call


def measure_planner(
    *,
    num_ids: int = 2048,
    num_blocks: int = 8192,
    num_layers: int = 61,
    repeat: int = 5,
    round_s: float = 0.02,
    seed: int = 0,
    use_vllm: bool = True,
    layouts: tuple[str, ...] = ("separated", "interleaved", "mla"),
) -> dict[str, Any]:
    """The ``planner`` section of ``moriio bench``.

    Top-level figures are those of the separated layout (``layout`` says so); ``layouts``
    holds every layout's figures and ``min_*`` the least speed-ups over them. A vLLM figure
    that could not be measured is ``None`` with a ``<key>_reason`` beside it.
    """
    rng = random.Random(seed)
    local = rng.sample(range(num_blocks), num_ids)
    remote = rng.sample(range(num_blocks), num_ids)
    per_layout: dict[str, dict[str, Any]] = {}
    call: str | None = None
    for layout in bench_layouts(num_blocks):
        if layout.name not in layouts:
            continue
        per_layout[layout.name], used = _measure_layout(
            layout,
            local,
            remote,
            num_blocks=num_blocks,
            num_layers=num_layers,
            repeat=repeat,
            round_s=round_s,
            use_vllm=use_vllm,
        )
        call = call or used
    headline_name = HEADLINE_LAYOUT if HEADLINE_LAYOUT in per_layout else next(iter(per_layout))
    headline = per_layout[headline_name]
    result: dict[str, Any] = {
        "layout": headline_name,
        "num_ids": num_ids,
        "num_blocks": num_blocks,
        "num_layers": num_layers,
        "repeat": repeat,
        "seed": seed,
        "vllm_version": vllm_version() if call else None,
        "vllm_call": call,
    }
    for key in (
        "us_per_plan",
        "naive_us_per_plan",
        "speedup_vs_naive",
        "request_61_layers_us",
        "naive_request_61_layers_us",
        "request_61_layers_speedup_vs_naive",
        *_VLLM_KEYS,
    ):
        result[key] = headline[key]
        if f"{key}_reason" in headline:
            result[f"{key}_reason"] = headline[f"{key}_reason"]
    for key in ("speedup_vs_vllm", "request_61_layers_speedup_vs_vllm"):
        values = [v[key] for v in per_layout.values() if v[key] is not None]
        if values and len(values) == len(per_layout):
            result[f"min_{key}"] = min(values)
        else:
            _set_null(result, f"min_{key}", "not measured for every layout")
    result["targets"] = {
        "speedup_vs_vllm": TARGET_SPEEDUP_VS_VLLM,
        "request_61_layers_speedup_vs_vllm": TARGET_REQUEST_SPEEDUP_VS_VLLM,
    }
    if result["min_speedup_vs_vllm"] is None:
        result["meets_targets"] = None
    else:
        result["meets_targets"] = (
            result["min_speedup_vs_vllm"] >= TARGET_SPEEDUP_VS_VLLM
            and result["min_request_61_layers_speedup_vs_vllm"] >= TARGET_REQUEST_SPEEDUP_VS_VLLM
        )
    result["layouts"] = per_layout
    return result


def _per_call_us(fn: Callable[[], object], number: int, repeat: int) -> tuple[float, float]:
    """(median, best) microseconds per call over ``repeat`` rounds of ``number`` calls."""
    rounds = timeit.Timer(fn).repeat(repeat=repeat, number=number)
    per_call = [r / number * 1e6 for r in rounds]
    return statistics.median(per_call), min(per_call)


def run_planner_benchmark(
    *,
    num_ids: int = 2048,
    num_blocks: int = 8192,
    block_size: int = 16,
    num_kv_heads: int = 8,
    head_size: int = 128,
    itemsize: int = 2,
    repeat: int = 7,
    seed: int = 0,
) -> dict[str, Any]:
    """Our planner vs the naive loop on a separated ``[2, nb, bs, H, D]`` layout."""
    shape = (2, num_blocks, block_size, num_kv_heads, head_size)
    spec = LayerSpec(block_size, num_kv_heads, head_size)
    layer0 = describe_layout(shape, dense_strides(shape), itemsize, spec)
    layer1 = describe_layout(shape, dense_strides(shape), itemsize, spec)
    rng = random.Random(seed)
    local = rng.sample(range(num_blocks), num_ids)
    remote = rng.sample(range(num_blocks), num_ids)

    plan = plan_transfer(layer0, local, remote, num_blocks)
    naive = plan_transfer_naive(layer0, local, remote, num_blocks)
    if plan.total_bytes != sum(naive[2]):
        raise AssertionError("vectorised and naive plans move different byte counts")

    plan_us, plan_best = _per_call_us(
        lambda: plan_transfer(layer0, local, remote, num_blocks), 200, repeat
    )
    naive_us, naive_best = _per_call_us(
        lambda: plan_transfer_naive(layer0, local, remote, num_blocks), 10, repeat
    )
    cache = PlanCache(local, remote, num_blocks)
    cache.plan_for(layer0)
    cached_us, cached_best = _per_call_us(lambda: cache.plan_for(layer1), 100_000, repeat)

    runs_local = list(range(100, 100 + num_ids))
    runs_remote = list(range(num_blocks - num_ids, num_blocks))
    coalesced = plan_transfer(layer0, runs_local, runs_remote, num_blocks)
    coalesced_us, _ = _per_call_us(
        lambda: plan_transfer(layer0, runs_local, runs_remote, num_blocks), 200, repeat
    )

    speedup = naive_us / plan_us
    return {
        "layout": f"separated {list(shape)} itemsize={itemsize}",
        "num_ids": num_ids,
        "descriptors": plan.num_descriptors,
        "total_bytes": plan.total_bytes,
        "plan_us": round(plan_us, 2),
        "plan_best_us": round(plan_best, 2),
        "naive_us": round(naive_us, 1),
        "naive_best_us": round(naive_best, 1),
        "speedup": round(speedup, 1),
        "cached_lookup_us": round(cached_us, 3),
        "cached_lookup_best_us": round(cached_best, 3),
        "contiguous_plan_us": round(coalesced_us, 2),
        "contiguous_descriptors": coalesced.num_descriptors,
        "targets": {
            "plan_us_max": TARGET_PLAN_US,
            "speedup_min": TARGET_SPEEDUP,
            "cached_lookup_us_max": TARGET_CACHED_US,
        },
        "meets_targets": plan_us <= TARGET_PLAN_US
        and speedup >= TARGET_SPEEDUP
        and cached_us < TARGET_CACHED_US,
    }
