"""Descriptors per request for hybrid models (vLLM's hybrid KV-cache manager).

Caches are allocated as vLLM 0.32 allocates them (each tensor holds one layer of every
group), the pairs come from :mod:`moriio.domain.kv.block_groups` and the plans from the
planner. The reference, computed in the same run, is one descriptor per layer per kept
block of its group (what a connector that registers every layer of every group apart, and
does not coalesce, posts). Block ids are either handed out in order (a fresh engine) or
shuffled (a long-running one).

Run: .venv/bin/python benchmarks/bench_hybrid_descriptors.py [--tokens N]
"""

from __future__ import annotations

import argparse
import random

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache

from moriio.domain.kv.block_groups import MISSING_BLOCK, NULL_BLOCK, movable_pairs, window
from moriio.domain.kv.planner import plan_transfer
from moriio.vllm_plugin.kv_views import resolve_layers

BLOCK = 64
NUM_BLOCKS = 4000
FULL = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=256, dtype=torch.bfloat16)
PAGE = FULL.page_size_bytes
STATE = MambaSpec(
    block_size=BLOCK,
    shapes=((3, 512), (4, 64, 64)),
    dtypes=(torch.bfloat16, torch.float32),
    page_size_padded=PAGE,
    mamba_cache_mode="align",
)
WINDOW = 1024
SLIDING = SlidingWindowSpec(
    block_size=BLOCK, num_kv_heads=2, head_size=256, dtype=torch.bfloat16, sliding_window=WINDOW
)


def _config(groups: list[tuple[KVCacheSpec, int]]) -> KVCacheConfig:
    specs = [
        KVCacheGroupSpec([f"model.layers.{i * len(groups) + g}.x" for i in range(n)], spec)
        for g, (spec, n) in enumerate(groups)
    ]
    layers = len(specs[0].layer_names)
    tensors = [
        KVCacheTensor(PAGE * NUM_BLOCKS * layers, s.layer_names, PAGE * NUM_BLOCKS, PAGE)
        for s in specs
    ]
    return KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=tensors, kv_cache_groups=specs)


def _table(shape: list[tuple[int, int]], shuffled: bool, seed: int) -> tuple[tuple[int, ...], ...]:
    """Per group: ``total`` positions, the first ``nulls`` of them the null block."""
    ids = list(range(1, NUM_BLOCKS))
    if shuffled:
        random.Random(seed).shuffle(ids)
    free = iter(ids)
    return tuple(
        tuple([NULL_BLOCK] * nulls + [next(free) for _ in range(total - nulls)])
        for total, nulls in shape
    )


def _count(
    groups: list[tuple[KVCacheSpec, int]], shape: list[tuple[int, int]], shuffled: bool
) -> tuple[int, int, int]:
    config = _config(groups)
    layers = resolve_layers(
        allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout.LBHNC), config, {}
    )
    prefill, decode = _table(shape, shuffled, 1), _table(shape, shuffled, 2)
    end = max(len(group) for group in decode)
    local, remote = movable_pairs(
        window(decode, 0, end, NULL_BLOCK), window(prefill, 0, end, MISSING_BLOCK)
    )
    ours = sum(
        plan_transfer(
            x.geometry, local, remote, NUM_BLOCKS, x.geometry.block_stride_bytes
        ).num_descriptors
        for x in layers
    )
    reference = sum(
        n * sum(1 for b in ids if b) for (_, n), ids in zip(groups, decode, strict=True)
    )
    return len(layers), ours, reference


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args()
    blocks = args.tokens // BLOCK
    kept = min(blocks, WINDOW // BLOCK + 1)
    models = {
        "linear attention (12 full + 36 Gated-DeltaNet layers)": (
            [(FULL, 12), (STATE, 12), (STATE, 12), (STATE, 12)],
            [(blocks, 0)] + [(blocks, blocks - 1)] * 3,
        ),
        f"sliding window (10 full + 50 window-{WINDOW} layers)": (
            [(FULL, 10)] + [(SLIDING, 10)] * 5,
            [(blocks, 0)] + [(blocks, blocks - kept)] * 5,
        ),
    }
    print(f"{args.tokens}-token prompt, {BLOCK}-token blocks")
    print(
        f"{'model':56} {'block ids':9} {'tensors':>7} {'moriio':>7} {'per layer':>9} {'ratio':>6}"
    )
    for name, (groups, shape) in models.items():
        for shuffled in (False, True):
            tensors, ours, reference = _count(groups, shape, shuffled)
            order = "shuffled" if shuffled else "in order"
            print(f"{name:56} {order:9} {tensors:7} {ours:7} {reference:9} {ours / reference:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
