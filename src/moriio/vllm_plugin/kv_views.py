"""vLLM's KV-cache declarations -> moriio's layer geometry and the facts peers compare.

Geometry comes from what vLLM declares, never from guessing at shapes: each transferred
layer's own ``KVCacheSpec`` (inside ``UniformTypeKVCacheSpecs`` too) says what its
``[nb*k, H, N, C]`` view must be (head slots, states per block, content bytes); the view's
strides give the block stride and the kernel blocks per block. A layer the planner cannot
move correctly is refused at registration with its backend, spec, shape and strides named,
and so is device KV memory that cannot be exported to a peer process (expandable segments).

With vLLM's hybrid KV-cache manager (several groups) each KV tensor holds one layer of
every group, one page per block whatever group owns it: full and sliding-window attention
views, and Mamba / linear-attention state views (conv then SSM state, padded to the page).
Such a tensor is registered once, through its attention view (which spans the whole page),
under the name of the last layer that writes it, so a WRITE push starts once all of its
layers are computed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from moriio.domain.kv.layout import LayerGeometry, LayerSpec
from moriio.domain.protocol.fingerprint import LayerFacts
from moriio.domain.worker.kv_registry import LayerTensor
from moriio.ports import Allocation, MemoryKind
from moriio.vllm_plugin.vllm_facts import quant_mode_name

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig, KVCacheSpec

# torch's allocator settings: the first of these that is set applies (HIP: ROCm builds only)
ALLOC_CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
SUPPORTED_SPECS = (
    "full attention, sliding-window and chunked-local attention, MLA, and Mamba / "
    "linear-attention state sharing its pages with an attention layer"
)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def transfer_group_ids(kv_cache_config: KVCacheConfig) -> tuple[int, ...]:
    """The cache groups vLLM moves between engines (all groups on a config without the
    distinction)."""
    ids = getattr(kv_cache_config, "transfer_group_ids", None)
    return tuple(ids) if ids is not None else tuple(range(len(kv_cache_config.kv_cache_groups)))


def check_transferable(kv_cache_config: KVCacheConfig) -> None:
    """Refuse at start-up a cache moriio cannot move: a transferred spec that is neither
    attention with layer views nor Mamba state (raw storage, encoder caches, ...)."""
    for name, spec in transfer_specs(kv_cache_config).items():
        if not _is_attention(spec) and not _is_state(spec):
            raise ValueError(
                f"KV cache layer {name!r} has a {type(spec).__name__}, which moriio cannot "
                f"move: supported are {SUPPORTED_SPECS}"
            )


def num_transfer_groups(kv_cache_config: KVCacheConfig) -> int:
    return len(transfer_group_ids(kv_cache_config))


def has_state_groups(kv_cache_config: KVCacheConfig) -> bool:
    """Whether a transferred group holds Mamba / linear-attention state (one state per
    request, loaded as it stood before the last prompt token)."""
    return any(_is_state(spec) for spec in transfer_specs(kv_cache_config).values())


def frees_positions(kv_cache_config: KVCacheConfig) -> bool:
    """Whether a transferred group may hold vLLM's null block in a request's block list
    (sliding-window, chunked-local and state groups free positions; full attention and MLA
    keep every one)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return not all(
        isinstance(spec, FullAttentionSpec) for spec in transfer_specs(kv_cache_config).values()
    )


def _is_attention(spec: KVCacheSpec) -> bool:
    from vllm.v1.kv_cache_interface import AttentionSpec

    return isinstance(spec, AttentionSpec) and bool(spec.has_layer_views)


def _is_state(spec: KVCacheSpec) -> bool:
    from vllm.v1.kv_cache_interface import MambaSpec

    return isinstance(spec, MambaSpec)


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
    """One transferred layer: its tensor as plain numbers, its geometry and its facts;
    ``view``: the attention layer whose view is registered; ``shared``: every transferred
    layer of the tensor (one per group with the hybrid manager)."""

    tensor: LayerTensor
    geometry: LayerGeometry
    facts: LayerFacts
    backend: str
    view: str = ""
    shared: tuple[str, ...] = ()


def resolve_layers(
    kv_caches: Mapping[str, torch.Tensor],
    kv_cache_config: KVCacheConfig,
    backends: Mapping[str, str],
) -> list[ResolvedLayer]:
    """Every transferred KV tensor of ``kv_caches``, once, checked against its spec.

    Layers of groups vLLM does not transfer are skipped; layers whose views start at the
    same address share one tensor, registered once (see the module docstring). ValueError
    names the layer, backend, spec, shape and strides of a view the planner cannot move,
    and a tensor holding only Mamba state.
    """
    specs = transfer_specs(kv_cache_config)
    hybrid = num_transfer_groups(kv_cache_config) > 1
    sharing: dict[int, list[str]] = {}
    for name, tensor in kv_caches.items():
        if name in specs:
            sharing.setdefault(tensor.data_ptr(), []).append(name)
    resolved: list[ResolvedLayer] = []
    for names in sharing.values():
        viewed = next((n for n in names if _is_attention(specs[n])), None)
        if viewed is None:
            raise ValueError(
                f"KV cache layers {names} share a tensor without an attention layer "
                f"({type(specs[names[0]]).__name__}): moriio moves state pages through the "
                "attention view of the same tensor"
            )
        name = max(names, key=_layer_order(names)) if hybrid else viewed
        view = _resolve(viewed, kv_caches[viewed], specs[viewed], backends.get(viewed, "unknown"))
        _check_state_fits(view, {n: specs[n] for n in names if _is_state(specs[n])})
        resolved.append(replace(_renamed(view, name), view=viewed, shared=tuple(names)))
    missing = sorted(set(specs) - set(kv_caches))
    if missing:
        raise ValueError(f"KV cache layers {missing} have a spec but no cache tensor")
    if not resolved:
        raise ValueError("no KV cache layer to transfer")
    return resolved


def _check_state_fits(view: ResolvedLayer, states: Mapping[str, KVCacheSpec]) -> None:
    """A state page moves as part of its tensor's attention page: refuse a state larger
    than the page the attention view moves (vLLM pads both to one size; never assumed)."""
    for name, spec in states.items():
        shapes = getattr(spec, "shapes", ())
        dtypes = getattr(spec, "dtypes", ())
        size = sum(
            math.prod(shape) * dtype.itemsize for shape, dtype in zip(shapes, dtypes, strict=True)
        )
        if size > view.geometry.block_len:
            raise ValueError(
                f"KV cache layer {name!r}: its {size}-byte state does not fit the "
                f"{view.geometry.block_len}-byte page moved through {view.tensor.name!r}"
            )


def _layer_order(names: list[str]) -> Callable[[str], tuple[int, int]]:
    """Orders layer names by their index in the model (then as vLLM listed them)."""
    from vllm.model_executor.models.utils import extract_layer_index

    def key(name: str) -> tuple[int, int]:
        try:
            return extract_layer_index(name), names.index(name)
        except (AssertionError, ValueError):
            return -1, names.index(name)

    return key


def _renamed(layer: ResolvedLayer, name: str) -> ResolvedLayer:
    if layer.tensor.name == name:
        return layer
    return replace(
        layer, tensor=replace(layer.tensor, name=name), facts=replace(layer.facts, name=name)
    )


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
        quant=quant_mode_name(attention.kv_quant_mode),
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
