"""How each transferred KV tensor's pages shard over TP ranks, read from vLLM's own layers.

Per KV-cache group vLLM moves, in group order, a tensor's page is attention KV (its heads
laid out the way the layer's backend folds them into the view, :class:`HeadOrder`) or one
Mamba / linear-attention layer's state (its parts sharded the way the layer loads its
weights: a Gated-DeltaNet convolution state holds this rank's ``q``, ``k`` and ``v`` heads,
in that order, each sub-projection sharded on its own like ``conv1d``'s weight loader, and
its recurrent state this rank's value heads; Mamba2 the same with ``x``, ``B``, ``C``;
Mamba1 its ``x`` channels). The numbers come from the layer objects and are checked against
the layer's ``MambaSpec``; a layout moriio does not know how to slice is marked
:class:`Unsliceable` with the reason, and a peer of another TP size is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from math import prod
from typing import TYPE_CHECKING, Any

from moriio.domain.kv.head_slices import GroupSlicing, Unsliceable
from moriio.domain.kv.slice_layouts import HeadOrder, StatePart, head_slices, state_slices
from moriio.vllm_plugin.kv_views import ResolvedLayer, transfer_group_ids

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

# Backends whose two head slots are a K plane and a V plane of ``kv`` heads each: how the
# kernels address a head inside a plane (``rocm_attn``: ``split_kv_cache``'s head-major
# ``[kv, D/x, N, x]`` tiles; AITER FA's shuffle layout: ``kv`` tiles of ``D * N``; B12X:
# ``unflatten(-1, (kv, D))`` of each state's row).
PLANE_ORDERS = {"ROCM_ATTN": HeadOrder.TILES, "FLASH_ATTN": HeadOrder.TILES, "B12X": HeadOrder.ROWS}


def head_order(spec: KVCacheSpec, backend: str) -> HeadOrder | Unsliceable | None:
    """How ``backend`` lays a page's KV heads out for ``spec`` (None: MLA's latent, which
    every rank holds whole)."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    if isinstance(spec, MLAAttentionSpec):
        return None
    slots = getattr(spec, "num_head_slots", None)
    heads = spec.num_kv_heads  # type: ignore[attr-defined]
    if slots is None or (slots == heads and slots != 2):
        return HeadOrder.SLOTS
    if slots == 2 * heads and spec.kv_quant_mode.is_nvfp4:  # type: ignore[attr-defined]
        return HeadOrder.NVFP4
    if slots == 2 and backend in PLANE_ORDERS:
        return PLANE_ORDERS[backend]
    if slots == heads:
        return HeadOrder.SLOTS
    return Unsliceable(
        f"backend {backend} folds {heads} KV heads into {slots} head slots in an order "
        "moriio does not know"
    )


def attention_slicing(
    layer: ResolvedLayer, spec: KVCacheSpec, total_kv_heads: int, tp_size: int
) -> GroupSlicing:
    """Where this rank's KV heads lie in ``layer``'s pages."""
    order = head_order(spec, layer.backend)
    if not isinstance(order, HeadOrder):
        return order
    try:
        return head_slices(layer.geometry, order, total_kv_heads, tp_size)
    except ValueError as exc:
        return Unsliceable(f"{layer.backend} pages of {layer.tensor.name!r}: {exc}")


def state_slicing(mixer: Any, spec: KVCacheSpec, tp_size: int) -> GroupSlicing:
    """Where this rank's shard of ``mixer``'s state lies in a page (``mixer``: vLLM's Mamba /
    linear-attention layer object, ``spec`` its ``MambaSpec``)."""
    if getattr(spec, "tp_replicated", False):
        return None
    kind = str(getattr(mixer.mamba_type, "name", mixer.mamba_type))
    shapes = tuple(map(tuple, spec.shapes))  # type: ignore[attr-defined]
    dtypes = spec.dtypes  # type: ignore[attr-defined]
    if len(shapes) != 2 or len(shapes[0]) != 2:
        return Unsliceable(f"a {kind} state of {len(shapes)} parts {list(shapes)}")
    parts = _projections(mixer, kind)
    if isinstance(parts, Unsliceable):
        return parts
    projections, (heads, head_elems) = parts
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    conv_dims = sum(total // tp_size * width for total, width in projections)
    dim_first = is_conv_state_dim_first()
    rows = shapes[0][1] if dim_first else shapes[0][0]
    if (shapes[0] != (conv_dims, rows) if dim_first else shapes[0] != (rows, conv_dims)) or (
        prod(shapes[1]) != heads // tp_size * head_elems
    ):
        return Unsliceable(
            f"the {kind} layer's sharding ({projections}, {heads} heads of {head_elems}) does "
            f"not give its state shapes {list(shapes)}"
        )
    ci, si = dtypes[0].itemsize, dtypes[1].itemsize
    out, offset = [], 0
    for total, width in projections:
        local = total // tp_size
        if dim_first:  # (channels, rows): a unit's channels hold all its rows
            unit = width * rows * ci
            out.append(StatePart(offset, unit, unit, 1, unit, local, total))
        else:  # (rows, channels): every row holds each unit's channels
            cell = width * ci
            out.append(StatePart(offset, cell, conv_dims * ci, rows, cell, local, total))
        offset += local * width * (rows if dim_first else 1) * ci
    conv_bytes = prod(shapes[0]) * ci
    unit = head_elems * si
    out.append(StatePart(conv_bytes, unit, unit, 1, unit, heads // tp_size, heads))
    return state_slices(out, f"{kind.lower()} state")


Projections = tuple[tuple[tuple[int, int], ...], tuple[int, int]]


def _projections(mixer: Any, kind: str) -> Projections | Unsliceable:
    """``((units, unit width) per convolution sub-projection, (state heads, elements per
    head))`` as the layer shards them, from its own attributes."""
    try:
        if kind == "GDN_ATTN":
            nk, hk, nv, hv = (
                mixer.num_k_heads,
                mixer.head_k_dim,
                mixer.num_v_heads,
                mixer.head_v_dim,
            )
            return ((nk, hk), (nk, hk), (nv, hv)), (nv, hv * hk)
        if kind == "MAMBA2":
            if getattr(mixer, "n_groups", 0) % mixer.tp_size:
                return Unsliceable("Mamba2 groups replicated to follow the heads over TP")
            nh, hd, ng, ss = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size
            return ((nh, hd), (ng, ss), (ng, ss)), (nh, hd * ss)
        if kind == "MAMBA1":
            size, ss = mixer.intermediate_size, mixer.ssm_state_size
            return ((size, 1),), (size, ss)
    except AttributeError as exc:
        return Unsliceable(f"the {kind} layer does not say how it shards: {exc}")
    return Unsliceable(f"moriio does not know how a {kind} state shards over TP ranks")


def with_slicing(
    layers: Sequence[ResolvedLayer],
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    specs: Mapping[str, KVCacheSpec],
) -> list[ResolvedLayer]:
    """``layers`` with each tensor's slicing per transferred group (the tensor's attention
    view for attention groups, the group's own layer for a state group)."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.v1.kv_cache_interface import MambaSpec

    parallel = vllm_config.parallel_config
    tp = parallel.tensor_parallel_size
    total = max(1, vllm_config.model_config.get_total_num_kv_heads())
    state_names = {n for n, s in specs.items() if isinstance(s, MambaSpec)}
    mixers = get_layers_from_vllm_config(vllm_config, MambaBase, state_names)  # type: ignore[type-abstract]
    groups = [kv_cache_config.kv_cache_groups[g] for g in transfer_group_ids(kv_cache_config)]
    out = []
    for layer in layers:
        attention = attention_slicing(layer, specs[layer.view], total, tp)
        slicing: list[GroupSlicing] = []
        for group in groups:
            names = [n for n in group.layer_names if n in layer.shared]
            state = next((n for n in names if n in state_names), None)
            if state is None:
                slicing.append(attention)
            elif state not in mixers:
                slicing.append(Unsliceable(f"state layer {state!r} is not in the model"))
            else:
                slicing.append(state_slicing(mixers[state], specs[state], tp))
        out.append(replace(layer, tensor=replace(layer.tensor, slicing=tuple(slicing))))
    return out
