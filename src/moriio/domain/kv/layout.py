"""KV-cache layout geometry: where each logical block's bytes live inside one layer's tensor.

A layer's KV cache arrives as a shape, element strides and an item size (plain ints, no
tensor library). :func:`describe_layout` recognises the layouts below and returns a frozen,
hashable :class:`LayerGeometry` that the transfer planner turns into byte offsets.

* PAGE VIEW ``[nb*k, H, N, C]`` (vLLM 0.32, MLA included): one opaque chunk per block, see
  :mod:`moriio.domain.kv.page_view`; the kind is PACKED, or MLA for an MLA layer.
* MLA ``[nb, bs, latent]`` (older engines): one chunk per block (the block page).
* SEPARATED ``[2, nb, bs, H, D]`` or ``[2, nb, H, bs, D]``: a K chunk and a V chunk per
  block; the V half follows all K blocks.
* INTERLEAVED ``[nb, 2, bs, H, D]`` or ``[nb, 2, H, bs, D]``: a K chunk and a V chunk per
  block, both inside the block page.
* KERNEL_BLOCKS ``[nb*k, 2, kbs, H, D]``: one chunk per block, its ``k`` adjacent kernel
  blocks.

Rules:

* Strides may be padded (a block stride larger than the dense block): offsets use the real
  strides, but each chunk (K, V or whole page) must be one contiguous run of bytes, in any
  dimension order (``bs``/``H`` may be swapped, e.g. an HND view of an NHD allocation).
* Kernel sub-blocks: a backend may split a logical block of ``spec.block_size`` tokens into
  ``k`` kernel blocks of ``kbs`` tokens, giving ``k * nb`` entries on the block axis. The
  kernel-block axis is dim 2 or dim 3 of a 5-D shape; an axis matches when its size divides
  ``spec.block_size`` and the other two page dims match ``spec.num_kv_heads`` and
  ``spec.head_size`` (``None`` in the spec matches anything). An axis equal to
  ``spec.block_size`` is preferred (no split); two matching axes of different sizes are
  ambiguous and raise ValueError.
* With ``shape[0] == 2`` (K/V axis outermost) a split into kernel blocks stays SEPARATED: the
  K chunk of a logical block is its ``k`` adjacent kernel pages, so kernel pages must be
  dense (kernel-block stride == kernel page size). With ``shape[1] == 2`` and ``k > 1`` the
  layout is KERNEL_BLOCKS: each kernel block holds its K page then its V page, and the
  logical block is the single run of ``k`` dense kernel blocks.
* ``shape[0] == 2`` is read as the K/V axis even when ``shape[1] == 2`` too (a 2-block cache).
* The kind follows the bytes: a ``[2, nb, ...]`` view whose V page sits inside each block
  page is INTERLEAVED, and a ``[nb, 2, ...]`` view whose V half follows all K blocks is
  SEPARATED.
* SEPARATED: the peer's V half is taken to start right after its ``remote_num_blocks``
  K blocks (see :meth:`LayerGeometry.remote_v_offset`); other kinds use the local V offset
  on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence

from moriio.domain.kv.geometry import (
    GeometryKey,
    LayerGeometry,
    LayerKind,
    LayerSpec,
    LayoutKind,
    as_int_tuple,
    dense_elements,
    matches,
    positive,
)
from moriio.domain.kv.page_view import describe_page_view

__all__ = [
    "GeometryKey",
    "LayerGeometry",
    "LayerKind",
    "LayerSpec",
    "LayoutKind",
    "describe_layout",
]


def describe_layout(
    shape: Sequence[int], strides: Sequence[int], itemsize: int, spec: LayerSpec
) -> LayerGeometry:
    """Recognise a layer's KV-cache layout; ValueError names the shape if unsupported."""
    shp = as_int_tuple("shape", shape)
    std = as_int_tuple("strides", strides)
    itemsize = as_int_tuple("itemsize", (itemsize,))[0]
    positive("itemsize", itemsize)
    if len(shp) != len(std):
        raise ValueError(f"shape {shp} and strides {std} differ in length")
    if any(n <= 0 for n in shp):
        raise ValueError(f"KV cache shape {shp} has an empty dimension")
    if any(s < 0 for s in std):
        raise ValueError(f"KV cache strides {std} (shape {shp}) must not be negative")
    key: GeometryKey = (shp, std, itemsize, spec)
    region_len = itemsize * (1 + sum((n - 1) * s for n, s in zip(shp, std, strict=True)))
    if len(shp) == 4:
        return describe_page_view(key, region_len)
    if spec.kind == "mla":
        return _describe_mla(key, region_len)
    if len(shp) == 5:
        return _describe_kv(key, region_len)
    raise ValueError(
        f"unsupported KV cache shape {shp} for an attention layer: expected "
        "[2, nb, bs, H, D], [2, nb, H, bs, D], [nb, 2, bs, H, D], [nb, 2, H, bs, D], "
        "[nb*k, 2, kbs, H, D] or a page view [nb*k, H, N, C]"
    )


def _single_chunk(
    kind: LayoutKind, key: GeometryKey, region_len: int, page_elems: int | None, nb: int
) -> LayerGeometry:
    shp, std, itemsize, spec = key
    if page_elems is None:
        raise ValueError(f"KV cache shape {shp} strides {std}: a block page is not contiguous")
    block_len = page_elems * itemsize
    block_stride = std[0] * itemsize
    if nb > 1 and block_stride < block_len:
        raise ValueError(f"KV cache shape {shp} strides {std}: block pages overlap")
    return LayerGeometry(
        kind, nb, spec.block_size, 1, block_len, block_stride, 0, 1, region_len, key
    )


def _describe_mla(key: GeometryKey, region_len: int) -> LayerGeometry:
    shp, std, _, spec = key
    if len(shp) != 3 or shp[1] != spec.block_size or not matches(spec.head_size, shp[2]):
        raise ValueError(
            f"unsupported KV cache shape {shp} for an MLA layer: expected the page view "
            f"[num_blocks, 1, {spec.block_size}, {spec.head_size or 'latent'}] or "
            f"[num_blocks, {spec.block_size}, {spec.head_size or 'latent'}]"
        )
    return _single_chunk(LayoutKind.MLA, key, region_len, dense_elements(shp[1:], std[1:]), shp[0])


def _kernel_block_size(shp: tuple[int, ...], spec: LayerSpec) -> int:
    """Tokens per kernel block: the size of the block axis (dim 2 or 3) of a 5-D shape."""
    candidates = [
        shp[axis]
        for axis in (2, 3)
        if spec.block_size % shp[axis] == 0
        and matches(spec.num_kv_heads, shp[5 - axis])
        and matches(spec.head_size, shp[4])
    ]
    if spec.block_size in candidates:
        return spec.block_size
    if not candidates:
        raise ValueError(
            f"unsupported KV cache shape {shp}: no block axis (dim 2 or 3) of size "
            f"{spec.block_size} or a divisor of it next to {spec.num_kv_heads} heads "
            f"of size {spec.head_size}"
        )
    if len(set(candidates)) > 1:
        raise ValueError(
            f"Ambiguous kernel-block axis in KV cache shape {shp}: dims 2 and 3 both divide "
            f"block_size {spec.block_size}; give num_kv_heads/head_size in the spec"
        )
    return candidates[0]


def _describe_kv(key: GeometryKey, region_len: int) -> LayerGeometry:
    shp, std, itemsize, spec = key
    if shp[0] == 2:
        kv_axis, block_axis = 0, 1
    elif shp[1] == 2:
        kv_axis, block_axis = 1, 0
    else:
        raise ValueError(
            f"unsupported KV cache shape {shp}: a 5-D cache needs a K/V axis of size 2 at "
            "dim 0 ([2, nb, bs, H, D]) or dim 1 ([nb, 2, bs, H, D])"
        )
    kbs = _kernel_block_size(shp, spec)
    k = spec.block_size // kbs
    kernel_blocks = shp[block_axis]
    if kernel_blocks % k:
        raise ValueError(
            f"KV cache shape {shp}: {kernel_blocks} kernel blocks of {kbs} tokens do not "
            f"form whole blocks of {spec.block_size}"
        )
    nb = kernel_blocks // k
    page = dense_elements(shp[2:], std[2:])
    if page is None:
        raise ValueError(f"KV cache shape {shp} strides {std}: a K/V page is not contiguous")
    kv, ks = std[kv_axis], std[block_axis]
    v_after_all = kv >= (kernel_blocks - 1) * ks + page
    v_in_page = page <= kv and kv + page <= ks
    if v_after_all and (kv_axis == 0 or not v_in_page):
        if k > 1 and ks != page:
            raise ValueError(
                f"KV cache shape {shp} strides {std}: kernel blocks of a logical block "
                "are not adjacent, so its K bytes are not one contiguous run"
            )
        return LayerGeometry(
            LayoutKind.SEPARATED,
            nb,
            spec.block_size,
            k,
            k * page * itemsize,
            k * ks * itemsize,
            kv * itemsize,
            2,
            region_len,
            key,
        )
    if not v_in_page:
        raise ValueError(f"KV cache shape {shp} strides {std}: K and V pages overlap")
    if k == 1:
        return LayerGeometry(
            LayoutKind.INTERLEAVED,
            nb,
            spec.block_size,
            1,
            page * itemsize,
            ks * itemsize,
            kv * itemsize,
            2,
            region_len,
            key,
        )
    if kv != page or ks != 2 * page:
        raise ValueError(
            f"KV cache shape {shp} strides {std}: kernel blocks of a logical block are "
            "not one contiguous run"
        )
    block_len = k * ks * itemsize
    return LayerGeometry(
        LayoutKind.KERNEL_BLOCKS,
        nb,
        spec.block_size,
        k,
        block_len,
        block_len,
        0,
        1,
        region_len,
        key,
    )
