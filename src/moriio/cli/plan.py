"""``moriio plan``: a layer's geometry and the transfer plan for given block ids; or, with
``--blocks``, a whole request's paths (per layer, one batch per request, staged) with their
descriptors, posts and estimated time, and the path the cost model chooses.

Examples (an older 5-D cache; vLLM 0.32's DeepSeek MLA page view in its resolved order; a
61-layer request of 8,192 random blocks between GPUs on two hosts)::

    moriio plan --explain --shape 2,8192,16,8,128 --dtype bfloat16 --block-size 16 \\
        --num-kv-heads 8 --head-size 128 --local 4-6,9 --remote 10-12,40
    moriio plan --explain --shape 8192,1,16,576 --page-order LBNHC --kind mla \\
        --block-size 16 --num-kv-heads 1 --head-size 576 --local 4-6,9
    moriio plan --explain --layers 61 --blocks 8192 --block-bytes 16384 --order random \\
        --memory device --peer remote

Between TP sizes (this TP 2 rank 1's view of 8 KV heads, reading from a TP 1 peer)::

    moriio plan --explain --shape 8192,4,16,256 --page-order LBHNC --block-size 16 \\
        --tp 2 --rank 1 --peer-tp 1 --total-kv-heads 8 --local 4-6,9 --remote 10-12,40
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from moriio.domain.kv.layout import LayerSpec
from moriio.domain.kv.path_costs import (
    DEFAULT_STAGING_BYTES,
    FigureKey,
    PathFigures,
    parse_figures,
)
from moriio.domain.kv.scenario import ORDERS
from moriio.domain.kv.shards import consumer_group, producer_group
from moriio.output import to_json
from moriio.plan import (
    PAGE_ORDERS,
    explain_paths,
    explain_plan,
    render_explain,
    render_paths,
    render_savings,
    render_summary,
)
from moriio.plan_split import HEAD_ORDERS, explain_split, render_split
from moriio.ports import MemoryKind


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """``"2,8192,16"`` (commas, optional brackets or spaces) -> ``(2, 8192, 16)``."""
    body = text.strip().strip("[]()")
    parts = [p for p in body.replace(" ", ",").split(",") if p]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"{what} is empty")
    return values


def parse_block_ids(text: str, what: str) -> list[int]:
    """Block ids: ``"4,5,9-12"`` (``a-b`` is an inclusive range); ``""`` is no ids."""
    ids: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        first, sep, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise ValueError(
                f"{what} block ids must look like 4,5,9-12, got {part!r} in {text!r}"
            ) from None
        if hi < lo:
            raise ValueError(f"{what} block id range {part!r} is descending")
        ids.extend(range(lo, hi + 1))
    return ids


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", help="tensor shape, e.g. 2,8192,16,8,128")
    parser.add_argument("--strides", help="element strides (default: contiguous)")
    parser.add_argument("--dtype", default="bfloat16", help="element type")
    parser.add_argument(
        "--block-size",
        type=int,
        help="tokens per block, as the engine's --block-size (with kernel-block splits the "
        "layer's block, not the kernel's: the shape alone cannot tell them apart)",
    )
    parser.add_argument("--num-kv-heads", type=int, help="KV heads (default: any)")
    parser.add_argument("--head-size", type=int, help="head size / MLA latent (default: any)")
    parser.add_argument("--head-size-v", type=int, help="V head size of a packed layout")
    parser.add_argument(
        "--kind",
        choices=("attention", "mla"),
        default="attention",
        help="the layer's attention: mla is one latent per token, attention K and V per head",
    )
    parser.add_argument(
        "--page-order",
        choices=PAGE_ORDERS,
        help="vLLM's resolved KVCacheLayout of a [B, H, N, C] view (gives the strides)",
    )
    parser.add_argument("--num-states", type=int, help="states per block (default: block size)")
    parser.add_argument("--content-bytes", type=int, help="bytes per (head slot, state) cell")
    parser.add_argument("--local", help="local block ids, e.g. 4,5,9-12")
    parser.add_argument("--remote", help="remote block ids (default: the local ids)")
    parser.add_argument("--remote-num-blocks", type=int, help="peer's block count")
    parser.add_argument("--tp", type=int, default=1, help="this rank's TP size")
    parser.add_argument("--rank", type=int, default=0, help="this rank's TP rank")
    parser.add_argument("--peer-tp", type=int, help="the peer's TP size (default: --tp)")
    parser.add_argument("--peer-rank", type=int, help="the peer rank (default: the first)")
    parser.add_argument("--total-kv-heads", type=int, help="the model's KV heads (split TP)")
    parser.add_argument(
        "--head-order",
        choices=HEAD_ORDERS,
        default="slots",
        help="how the backend lays heads out in a page (split TP)",
    )
    parser.add_argument(
        "--producer", action="store_true", help="this rank produces the KV (split TP)"
    )
    parser.add_argument("--explain", action="store_true", help="geometry and descriptors")
    parser.add_argument("--rows", type=int, default=10, help="descriptors to list")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    paths = parser.add_argument_group(
        "a whole request (--blocks): its paths and the one the cost model chooses"
    )
    paths.add_argument("--blocks", type=int, help="blocks the request moves")
    paths.add_argument("--layers", type=int, default=1, help="layers of the request")
    paths.add_argument("--block-bytes", type=int, help="bytes of one layer's block page")
    paths.add_argument(
        "--chunks-per-block", type=int, default=1, help="1: one page per block; 2: K and V apart"
    )
    paths.add_argument("--order", choices=ORDERS, default="random", help="block ids' order")
    paths.add_argument(
        "--memory", choices=[m.value for m in MemoryKind], default="device", help="KV memory"
    )
    paths.add_argument(
        "--peer", choices=("local", "remote"), default="remote", help="same host or another"
    )
    paths.add_argument("--cache-blocks", type=int, help="blocks per cache (default: 4x --blocks)")
    paths.add_argument(
        "--staging-bytes",
        type=int,
        default=DEFAULT_STAGING_BYTES,
        help="the staging region per peer (0: none)",
    )
    paths.add_argument("--layerwise", action="store_true", help="loads awaited layer by layer")
    paths.add_argument(
        "--no-same-host-copies", action="store_true", help="same-host device copies are off"
    )
    paths.add_argument("--figures", help="a JSON file of this host's figures (bench --paths)")


def _figures(path: str | None) -> dict[FigureKey, PathFigures] | None:
    if path is None:
        return None
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--figures {path}: {exc}") from None
    return parse_figures(raw.get("figures", raw) if isinstance(raw, dict) else raw, path)


def _paths_report(args: argparse.Namespace) -> dict[str, Any]:
    if args.block_bytes is None:
        raise ValueError("--blocks needs --block-bytes (one layer's block page)")
    order = args.page_order
    return explain_paths(
        layers=args.layers,
        blocks=args.blocks,
        block_bytes=args.block_bytes,
        memory=MemoryKind(args.memory),
        same_host=args.peer == "local",
        order=args.order,
        block_outer=order is not None and order.startswith("B"),
        chunks_per_block=args.chunks_per_block,
        cache_blocks=args.cache_blocks,
        staging_bytes=args.staging_bytes,
        layerwise=args.layerwise,
        same_host_copies=not args.no_same_host_copies,
        figures=_figures(args.figures),
    )


def _layer_report(args: argparse.Namespace) -> dict[str, Any]:
    missing = [
        flag
        for flag, value in (
            ("--shape", args.shape),
            ("--block-size", args.block_size),
            ("--local", args.local),
        )
        if value is None
    ]
    if missing:
        raise ValueError(f"a layer's plan needs {', '.join(missing)} (or --blocks: a request)")
    spec = LayerSpec(
        args.block_size,
        args.num_kv_heads,
        args.head_size,
        args.kind,
        args.head_size_v,
        args.num_states,
        args.content_bytes,
    )
    return explain_plan(
        shape=parse_ints(args.shape, "--shape"),
        strides=None if args.strides is None else parse_ints(args.strides, "--strides"),
        dtype=args.dtype,
        spec=spec,
        local_block_ids=parse_block_ids(args.local, "local"),
        remote_block_ids=None if args.remote is None else parse_block_ids(args.remote, "remote"),
        remote_num_blocks=args.remote_num_blocks,
        page_order=args.page_order,
    )


def run(args: argparse.Namespace) -> int:
    if args.peer_tp is not None and args.peer_tp != args.tp:
        return _run_split(args)
    try:
        report = _paths_report(args) if args.blocks is not None else _layer_report(args)
    except ValueError as exc:
        print(f"moriio plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(to_json(report))
    elif args.blocks is not None:
        print(render_paths(report))
    elif args.explain:
        print(render_explain(report, rows=args.rows))
    else:
        print(f"{report['geometry']['kind']} layout; {render_summary(report)}")
        print(render_savings(report))
    return 0


def _run_split(args: argparse.Namespace) -> int:
    """A split-head transfer between this rank and a peer rank of another TP size."""
    try:
        if args.total_kv_heads is None or args.local is None:
            raise ValueError("--total-kv-heads and --local are needed between TP sizes")
        consumer = not args.producer
        peer_rank = args.peer_rank
        if peer_rank is None:  # the first rank of the peer's group for this rank
            group = producer_group if consumer else consumer_group
            peer_rank = group(args.rank, args.tp, args.peer_tp).start
        local = parse_block_ids(args.local, "local")
        remote = local if args.remote is None else parse_block_ids(args.remote, "remote")
        report = explain_split(
            shape=parse_ints(args.shape, "--shape"),
            dtype=args.dtype,
            spec=LayerSpec(args.block_size, None, None, args.kind, None, args.num_states),
            page_order=args.page_order,
            head_order=args.head_order,
            total_kv_heads=args.total_kv_heads,
            tp=args.tp,
            rank=args.rank,
            peer_tp=args.peer_tp,
            peer_rank=peer_rank,
            local_block_ids=local,
            remote_block_ids=remote,
            remote_num_blocks=args.remote_num_blocks,
            consumer=consumer,
        )
    except ValueError as exc:
        print(f"moriio plan: error: {exc}", file=sys.stderr)
        return 2
    print(to_json(report) if args.json else render_split(report, rows=args.rows))
    return 0
