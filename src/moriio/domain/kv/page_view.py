"""vLLM 0.32's per-layer page view ``[nb*k, H, N, C]``: one opaque chunk per block.

Every attention backend of vLLM 0.32 (MLA included, with ``H == 1``) hands a connector this
4-D view of one shared buffer: H head slots, N states per kernel block, C the content of one
(slot, state) cell, K and V packed inside it, in the engine-wide page order. A block is its
``k`` kernel pages; it moves as one run of bytes that is never interpreted, so any page order
moves correctly between peers that share it (the handshake compares the order). Orders that
put the head axis outside the block axis (``LHBNC``, ``BHLNC``) are moved as two chunks per
block when there are two head slots (a K plane and a V plane); with more slots they would
need one chunk per slot, which the planner does not do, and are refused.
"""

from __future__ import annotations

from moriio.domain.kv.geometry import (
    GeometryKey,
    LayerGeometry,
    LayerSpec,
    LayoutKind,
    dense_elements,
    matches,
)


def describe_page_view(key: GeometryKey, region_len: int) -> LayerGeometry:
    """``[nb*k, H, N, C]``: one chunk per block, its ``k`` dense kernel pages."""
    shp, std, itemsize, spec = key
    heads, states, content = shp[1:]
    want_states = spec.states_per_block
    wanted = (
        f"[num_blocks*k, {spec.num_kv_heads or 'H'}, {want_states}/k, "
        f"{_content_text(spec, itemsize)}]"
    )
    if spec.kind == "mla" and heads != 1:
        raise ValueError(f"unsupported KV cache shape {shp} for an MLA layer: expected {wanted}")
    if not matches(spec.num_kv_heads, heads) or not _content_matches(spec, content, itemsize):
        raise ValueError(f"KV cache view {shp} does not match its spec: expected {wanted}")
    if want_states % states:
        raise ValueError(
            f"KV cache view {shp}: {states} states per kernel block do not divide the "
            f"{want_states} states of a block (expected {wanted})"
        )
    k = want_states // states
    if shp[0] % k:
        raise ValueError(
            f"KV cache view {shp}: {shp[0]} kernel blocks do not form whole blocks of {k}"
        )
    page = dense_elements(shp[1:], std[1:])
    if page is None:
        return _two_planes(key, region_len, k)
    if k > 1 and std[0] != page:
        raise ValueError(
            f"KV cache view {shp} strides {std}: the {k} kernel blocks of a block are not "
            "adjacent dense pages, so a block is not one contiguous run"
        )
    nb = shp[0] // k
    block_len = k * page * itemsize
    block_stride = k * std[0] * itemsize
    if nb > 1 and block_stride < block_len:
        raise ValueError(f"KV cache view {shp} strides {std}: block pages overlap")
    kind = LayoutKind.MLA if spec.kind == "mla" else LayoutKind.PACKED
    return LayerGeometry(
        kind, nb, spec.block_size, k, block_len, block_stride, 0, 1, region_len, key
    )


def _two_planes(key: GeometryKey, region_len: int, k: int) -> LayerGeometry:
    """Two head slots stored apart (a K plane and a V plane, e.g. ``LHBNC``): two chunks
    per block, SEPARATED when the second plane follows every block of the first (the peer's
    then starts after its own blocks), INTERLEAVED when it sits inside each block's stride."""
    shp, std, itemsize, spec = key
    plane = dense_elements(shp[2:], std[2:])
    if shp[1] != 2 or plane is None:
        raise ValueError(
            f"KV cache view {shp} strides {std}: a page is not contiguous, and its head "
            "slots are not two planes of contiguous states"
        )
    if k > 1 and std[0] != plane:
        raise ValueError(
            f"KV cache view {shp} strides {std}: the {k} kernel blocks of a block are not "
            "adjacent in each plane, so a block's half is not one contiguous run"
        )
    nb = shp[0] // k
    chunk, stride, second = k * plane * itemsize, k * std[0] * itemsize, std[1] * itemsize
    if nb > 1 and stride < chunk:
        raise ValueError(f"KV cache view {shp} strides {std}: block pages overlap")
    if second == nb * stride:
        kind = LayoutKind.SEPARATED
    elif chunk <= second and second + chunk <= stride:
        kind = LayoutKind.INTERLEAVED
    else:
        raise ValueError(
            f"KV cache view {shp} strides {std}: the second head slot neither follows every "
            "block of the first nor sits inside each block's stride"
        )
    return LayerGeometry(kind, nb, spec.block_size, k, chunk, stride, second, 2, region_len, key)


def _content_matches(spec: LayerSpec, content: int, itemsize: int) -> bool:
    if spec.content_bytes is not None:
        return content * itemsize == spec.content_bytes
    return matches(spec.content_elements(), content)


def _content_text(spec: LayerSpec, itemsize: int) -> str:
    if spec.content_bytes is not None:
        return f"{spec.content_bytes} bytes / {itemsize}"
    derived = spec.content_elements()
    return str(derived) if derived is not None else "C"
