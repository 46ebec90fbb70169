"""vLLM's KV-cache declarations -> moriio's layer geometry and the facts peers compare.

Geometry comes from what vLLM declares, never from guessing at shapes: each transferred
layer's own ``KVCacheSpec`` (inside ``UniformTypeKVCacheSpecs`` too) says what its
``[nb*k, H, N, C]`` view must be (head slots, states per block, content bytes); the view's
strides give the block stride and the kernel blocks per block. A layer the planner cannot
move correctly is refused at registration with its backend, spec, shape and strides named,
and so is device KV memory that cannot be exported to a peer process (expandable segments).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from moriio.domain.kv.layout import LayerGeometry, LayerSpec
from moriio.domain.wire.handshake import LayerFacts
from moriio.domain.worker.kv_registry import LayerTensor
from moriio.ports import Allocation, MemoryKind

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig, KVCacheSpec

# torch's allocator settings: the first of these that is set applies (HIP: ROCm builds only)
ALLOC_CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
HMA_REASON = (
    "moriio moves one block table per request and does not implement vLLM's hybrid "
    "KV-cache manager (SupportsHMA)"
)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def transfer_group_ids(kv_cache_config: KVCacheConfig) -> tuple[int, ...]:
    """The cache groups vLLM moves between engines (all groups on a config without the
    distinction)."""
    ids = getattr(kv_cache_config, "transfer_group_ids", None)
    return tuple(ids) if ids is not None else tuple(range(len(kv_cache_config.kv_cache_groups)))


def check_transferable(kv_cache_config: KVCacheConfig) -> None:
    """Refuse at start-up a cache moriio cannot move: several transferred groups (vLLM's
    hybrid manager) or a transferred spec that is not attention (Mamba, raw storage)."""
    from vllm.v1.kv_cache_interface import AttentionSpec

    groups = [kv_cache_config.kv_cache_groups[i] for i in transfer_group_ids(kv_cache_config)]
    if len(groups) > 1:
        kinds = ", ".join(type(g.kv_cache_spec).__name__ for g in groups)
        raise ValueError(f"{len(groups)} KV cache groups to transfer ({kinds}): {HMA_REASON}")
    for name, spec in transfer_specs(kv_cache_config).items():
        if not isinstance(spec, AttentionSpec) or not spec.has_layer_views:
            raise ValueError(
                f"KV cache layer {name!r} has a {type(spec).__name__}, which moriio cannot "
                f"move: only attention and MLA caches are supported ({HMA_REASON})"
            )


def transfer_specs(kv_cache_config: KVCacheConfig) -> dict[str, KVCacheSpec]:
    """Each transferred layer's own spec, in the groups' layer order."""
    specs: dict[str, KVCacheSpec] = {}
    for group_id in transfer_group_ids(kv_cache_config):
        group = kv_cache_config.kv_cache_groups[group_id]
        per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        for name in group.layer_names:
            specs[name] = per_layer[name] if per_layer is not None else group.kv_cache_spec
    return specs


def to_layer_spec(spec: KVCacheSpec) -> LayerSpec:
    """The geometry facts of an attention or MLA spec, as plain ints."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MLAAttentionSpec

    if not isinstance(spec, AttentionSpec):
        raise ValueError(f"unsupported KV cache spec {type(spec).__name__}: only attention and MLA")
    mla = isinstance(spec, MLAAttentionSpec)
    head_v = spec.head_size_v if not mla and spec.head_size_v != spec.head_size else None
    return LayerSpec(
        block_size=spec.block_size,
        num_kv_heads=spec.num_heads,
        head_size=spec.head_size,
        kind="mla" if mla else "attention",
        head_size_v=head_v or None,
        num_states=int(spec.num_states),
        content_bytes=spec.state_content_size_bytes,
    )


@dataclass(frozen=True, slots=True)
class ResolvedLayer:
    """One transferred layer: its tensor as plain numbers, its geometry and its facts."""

    tensor: LayerTensor
    geometry: LayerGeometry
    facts: LayerFacts
    backend: str


def resolve_layers(
    kv_caches: Mapping[str, torch.Tensor],
    kv_cache_config: KVCacheConfig,
    backends: Mapping[str, str],
) -> list[ResolvedLayer]:
    """Every transferred layer of ``kv_caches``, checked against its spec.

    Layers of groups vLLM does not transfer, and layers that share another layer's cache,
    are skipped. ValueError names the layer, backend, spec, shape and strides of a view the
    planner cannot move.
    """
    specs = transfer_specs(kv_cache_config)
    resolved: list[ResolvedLayer] = []
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    for name, tensor in kv_caches.items():
        storage = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        spec = specs.get(name)
        if spec is None or storage in seen:
            continue  # not transferred, or the cache of a layer it shares
        seen.add(storage)
        resolved.append(_resolve(name, tensor, spec, backends.get(name, "unknown")))
    missing = sorted(set(specs) - set(kv_caches))
    if missing:
        raise ValueError(f"KV cache layers {missing} have a spec but no cache tensor")
    if not resolved:
        raise ValueError("no KV cache layer to transfer")
    return resolved


def check_exportable(environ: Mapping[str, str] | None = None) -> None:
    """Refuse device KV memory from torch's expandable segments: CUDA/HIP IPC (UCX's
    cuda_ipc) cannot export it to a peer process. ValueError names the allocator setting."""
    env = os.environ if environ is None else environ
    names = ALLOC_CONF_VARIABLES if torch.version.hip else ALLOC_CONF_VARIABLES[:2]
    variable = next((v for v in names if v in env), None)
    if variable is None:
        return
    for option in env[variable].split(","):
        key, _, value = option.partition(":")
        if key.strip() == "expandable_segments" and value.strip().lower() == "true":
            raise ValueError(
                f"{variable}={env[variable]!r} enables expandable_segments:True: device KV "
                "memory from expandable segments cannot be exported to a peer process over "
                "CUDA/HIP IPC; start the engine without it (or with expandable_segments:False)"
            )


def _resolve(name: str, tensor: torch.Tensor, spec: KVCacheSpec, backend: str) -> ResolvedLayer:
    shape, strides = tuple(tensor.shape), tuple(tensor.stride())
    on_device = tensor.device.type != "cpu"
    if on_device:
        check_exportable()
    backing = tensor.untyped_storage()  # vLLM's shared KV buffer (padded to 4 KiB on ROCm)
    try:
        layer = LayerTensor(
            name=name,
            addr=tensor.data_ptr(),
            shape=shape,
            strides=strides,
            itemsize=tensor.element_size(),
            dtype=dtype_name(tensor.dtype),
            spec=to_layer_spec(spec),
            kind=MemoryKind.DEVICE if on_device else MemoryKind.HOST,
            device_id=tensor.device.index or 0 if on_device else 0,
            storage=Allocation(backing.data_ptr(), backing.nbytes()),
        )
    except ValueError as exc:
        raise ValueError(
            f"moriio cannot move KV cache layer {name!r} (backend {backend}, {spec!r}, "
            f"view shape {shape}, strides {strides}, {dtype_name(tensor.dtype)}): {exc}"
        ) from None
    geometry = layer.geometry
    return ResolvedLayer(layer, geometry, _facts(name, spec, geometry, layer.dtype), backend)


def _facts(name: str, spec: KVCacheSpec, geometry: LayerGeometry, dtype: str) -> LayerFacts:
    attention: AttentionSpec = spec  # type: ignore[assignment]  # checked by to_layer_spec
    role = getattr(attention, "cache_role", None)
    return LayerFacts(
        name=name,
        spec=type(spec).__name__,
        role="" if role is None else str(getattr(role, "value", role)),
        dtype=dtype,
        quant=attention.kv_quant_mode.name,
        block_size=attention.block_size,
        kernel_block_size=attention.block_size // geometry.kernel_blocks_per_block,
        heads=attention.num_heads,
        content_bytes=attention.state_content_size_bytes,
        page_bytes=attention.page_size_bytes,
    )


def layer_backends(vllm_config: VllmConfig, names: list[str]) -> dict[str, str]:
    """Each attention layer's backend name (empty when the model's layers are not known,
    e.g. a config built outside an engine)."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase, names)  # type: ignore[type-abstract]
    return {name: layer.get_attn_backend().get_name() for name, layer in layers.items()}
