"""vLLM 0.32's KV-cache views per backend, built as vLLM builds them: one ``Row`` per backend
(its layers' specs, page order, kernel block size) and :func:`views` over one flat int8
buffer with vLLM's own ``compute_layout_strides``, ``KVCacheTensor`` and
``create_kv_cache_views`` (``vllm-0.32`` sources: ``v1/kv_cache_interface.py``,
``v1/worker/utils.py``; per backend the spec fields its ``get_kv_cache_spec`` publishes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    KVCacheTensor,
    KVQuantMode,
    MLAAttentionSpec,
    SparseCacheRole,
    compute_layer_kv_cache_shape_bytes,
    compute_layout_strides,
    create_kv_cache_views,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

from moriio.domain.kv.layout import LayoutKind

L = KVCacheLayout
BF16, FP32, U8, I8 = torch.bfloat16, torch.float32, torch.uint8, torch.int8
LOCAL_BLOCKS, REMOTE_BLOCKS = 6, 9


def attn(bs: int, heads: int, d: int, dtype: torch.dtype, **kw: object) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=d, dtype=dtype, **kw)


def mla(bs: int, width: int, dtype: torch.dtype, **kw: object) -> MLAAttentionSpec:
    return MLAAttentionSpec(block_size=bs, num_kv_heads=1, head_size=width, dtype=dtype, **kw)


@dataclass(frozen=True)
class Row:
    """A backend's cache: its layers' specs (in the order they share a block for BL*
    layouts), the engine-wide page order, and the kernel block size when blocks split."""

    specs: tuple[KVCacheSpec, ...]
    layout: KVCacheLayout
    kind: LayoutKind
    kernel_block_size: int | None = None


NVFP4 = attn(
    16, 4, 64, U8, num_head_slots=8, state_content_bytes=64 // 2 + 64 // 16,
    kv_quant_mode=KVQuantMode.NVFP4,
)  # fmt: skip
ROWS = {
    # CUDA
    "flash_attn bf16 LBNHC": Row((attn(16, 4, 64, BF16),), L.LBNHC, LayoutKind.PACKED),
    "flash_attn fp8 LBNHC": Row(
        (attn(16, 4, 64, U8, kv_quant_mode=KVQuantMode.FP8_PER_TENSOR),),
        L.LBNHC,
        LayoutKind.PACKED,
    ),
    "flash_attn block 64 on kernel blocks of 16": Row(
        (attn(64, 2, 64, BF16),), L.LBNHC, LayoutKind.PACKED, kernel_block_size=16
    ),
    "flashinfer HND (SM100) LBHNC": Row((attn(32, 4, 64, BF16),), L.LBHNC, LayoutKind.PACKED),
    "flashinfer nvfp4 LBHNC": Row((NVFP4,), L.LBHNC, LayoutKind.PACKED),
    "triton int8 per-token-head": Row(
        (
            attn(
                16,
                2,
                64,
                I8,
                state_content_bytes=2 * 64 + 8,
                kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD,
            ),
        ),
        L.LBNHC,
        LayoutKind.PACKED,
    ),
    "triton int4 per-token-head": Row(
        (
            attn(
                16,
                2,
                64,
                U8,
                state_content_bytes=64 + 8,
                kv_quant_mode=KVQuantMode.INT4_PER_TOKEN_HEAD,
            ),
        ),
        L.LBNHC,
        LayoutKind.PACKED,
    ),
    "flashmla bf16 block 64": Row((mla(64, 576, BF16),), L.LBNHC, LayoutKind.MLA),
    "cutlass_mla block 128": Row((mla(128, 576, BF16),), L.LBNHC, LayoutKind.MLA),
    "triton_mla block 64 on kernel blocks of 16": Row(
        (mla(64, 576, BF16),), L.LBNHC, LayoutKind.MLA, kernel_block_size=16
    ),
    "flashmla_sparse fp8_ds_mla": Row(
        (mla(64, 576, U8, cache_dtype_str="fp8_ds_mla", state_content_bytes=656),),
        L.LBNHC,
        LayoutKind.MLA,
    ),
    "sparse MLA + indexer (DeepSeek V3.2), block-compact BLNHC": Row(
        (
            mla(64, 576, U8, cache_dtype_str="fp8_ds_mla", state_content_bytes=656),
            mla(64, 132, U8, cache_role=SparseCacheRole.INDEXER),
        ),
        L.BLNHC,
        LayoutKind.MLA,
    ),
    "MLA padded to 576-byte alignment (DeepSeek V4)": Row(
        (mla(16, 584 // 2, BF16, alignment=1024),), L.LBNHC, LayoutKind.MLA
    ),
    # ROCm
    "aiter_fa LBHNC": Row((attn(16, 4, 128, BF16),), L.LBHNC, LayoutKind.PACKED),
    "aiter_fa block 64 on kernel blocks of 32": Row(
        (attn(64, 4, 128, BF16),), L.LBHNC, LayoutKind.PACKED, kernel_block_size=32
    ),
    "aiter_fa shuffle: 2 head slots, C = H*D, LHBNC": Row(
        (attn(16, 4, 64, BF16, num_head_slots=2, state_content_bytes=4 * 64 * 2),),
        L.LHBNC,
        LayoutKind.SEPARATED,
    ),
    "rocm_attn: K plane and V plane, LHBNC": Row(
        (attn(16, 2, 64, BF16, num_head_slots=2, state_content_bytes=2 * 64 * 2),),
        L.LHBNC,
        LayoutKind.SEPARATED,
    ),
    "aiter_unified LBHNC": Row((attn(16, 8, 64, BF16),), L.LBHNC, LayoutKind.PACKED),
    "aiter_mla block 1": Row((mla(1, 576, BF16),), L.LBNHC, LayoutKind.MLA),
    # CPU
    "cpu_attn fp32 LBHNC": Row((attn(32, 2, 64, FP32),), L.LBHNC, LayoutKind.PACKED),
    "cpu_attn fp8_e5m2 LBHNC": Row(
        (attn(32, 2, 64, U8, kv_quant_mode=KVQuantMode.FP8_PER_TENSOR),),
        L.LBHNC,
        LayoutKind.PACKED,
    ),
    "cpu_mla block 16": Row((mla(16, 576, BF16),), L.LBNHC, LayoutKind.MLA),
    "LBNHC, two layers": Row((attn(16, 4, 64, BF16),) * 2, L.LBNHC, LayoutKind.PACKED),
    # block-outer layouts: a layer's pages of all blocks are one group block apart
    "BLHNC, two layers per block": Row(
        (attn(16, 2, 64, BF16), attn(16, 2, 64, BF16)), L.BLHNC, LayoutKind.PACKED
    ),
    "BHLNC, two head slots, two layers": Row(
        (attn(16, 2, 64, BF16, num_head_slots=2, state_content_bytes=256),) * 2,
        L.BHLNC,
        LayoutKind.INTERLEAVED,
    ),
}


def views(
    row: Row, num_blocks: int, raw: torch.Tensor | None = None
) -> tuple[torch.Tensor, list[tuple[KVCacheSpec, torch.Tensor]]]:
    """One flat int8 buffer (random bytes unless given) and each layer's spec and view of
    it, as vLLM builds them: one ``KVCacheTensor`` per distinct spec; block-outer layouts
    share each block between the layers, layer-outer ones give each layer its region."""
    outer = row.layout.is_block_outermost
    per_block = sum(spec.page_size_bytes for spec in row.specs) if outer else None
    tensors, offset = [], 0
    for spec in dict.fromkeys(row.specs):
        names = [f"layer{i}" for i, s in enumerate(row.specs) if s == spec]
        fixed = (None, per_block, None, None, None)
        strides = compute_layout_strides(
            spec, num_blocks, len(names), row.layout, fixed_strides=fixed
        )
        tensors.append((spec, KVCacheTensor(0, names, strides[0], strides[1], offset)))
        shape = (len(names), *compute_layer_kv_cache_shape_bytes(spec, num_blocks))
        extent = offset + sum((n - 1) * st for n, st in zip(shape, strides, strict=True)) + 1
        offset = offset + len(names) * spec.page_size_bytes if outer else extent
    size = max(offset, (per_block or 0) * num_blocks)
    if raw is None:
        rng = np.random.default_rng(num_blocks)
        raw = torch.from_numpy(rng.integers(-128, 128, size, dtype=np.int8))
    views = [
        (spec, view)
        for spec, tensor in tensors
        for view in create_kv_cache_views(
            raw, spec, num_blocks, row.layout, tensor, row.kernel_block_size
        )
    ]
    return raw, views
