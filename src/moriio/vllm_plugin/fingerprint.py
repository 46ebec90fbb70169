"""This engine's compatibility fingerprint: everything that gives its KV bytes their meaning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from moriio.config.settings import ConnectorSettings
from moriio.domain.protocol.fingerprint import STATE_GROUP_MARK, Fingerprint
from moriio.vllm_plugin.kv_views import ResolvedLayer, transfer_group_ids
from moriio.vllm_plugin.vllm_facts import value_layout

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig


def engine_fingerprint(
    settings: ConnectorSettings,
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    layers: Sequence[ResolvedLayer],
) -> Fingerprint:
    """The fingerprint peers compare at the handshake (vLLM version, resolved page order,
    cache dtype string, backends, platform, V layout, groups, speculative config, per-layer
    facts)."""
    import vllm
    from vllm.platforms import current_platform

    model = vllm_config.model_config
    parallel = vllm_config.parallel_config
    backends = sorted({layer.backend for layer in layers})
    return Fingerprint(
        model_name=str(model.model),
        dtype=str(model.dtype).removeprefix("torch."),
        block_size=vllm_config.cache_config.block_size,
        layout_kinds=tuple(layer.geometry.kind.value for layer in layers),
        tp_size=parallel.tensor_parallel_size,
        transfer_mode=settings.mode,
        total_num_kv_heads=max(1, model.get_total_num_kv_heads()),
        is_mla=all(layer.tensor.spec.kind == "mla" for layer in layers),
        vllm_version=str(vllm.__version__),
        kv_layout=resolved_kv_layout(vllm_config),
        cache_dtype=str(vllm_config.cache_config.cache_dtype),
        attn_backend=",".join(backends),
        platform=str(current_platform.device_type),
        speculative=speculative_summary(vllm_config),
        value_layout=value_layout(vllm_config, [layer.tensor.name for layer in layers]),
        groups=group_structure(kv_cache_config),
        pp_size=parallel.pipeline_parallel_size,
        dcp_size=getattr(parallel, "decode_context_parallel_size", 1) or 1,
        layers=tuple(layer.facts for layer in layers),
    )


def resolved_kv_layout(vllm_config: VllmConfig) -> str:
    """The engine-wide page order vLLM resolved (``LBNHC``, ``LBHNC``, ``BL...``)."""
    try:
        return str(vllm_config.cache_config.get_resolved_kv_cache_layout().name)
    except ValueError:
        return "unresolved"


def speculative_summary(vllm_config: VllmConfig) -> str:
    """What of the speculative config changes the cached state (empty without one)."""
    spec = vllm_config.speculative_config
    if spec is None:
        return ""
    draft = getattr(spec.draft_model_config, "model", None)
    kv_dtype = getattr(spec, "kv_cache_dtype", None) or vllm_config.cache_config.cache_dtype
    return f"{spec.method}:{draft}:{spec.num_speculative_tokens}:{kv_dtype}"


def group_structure(kv_cache_config: KVCacheConfig) -> tuple[str, ...]:
    """Each cache group as ``Spec:layers``, then what gives a hybrid group's pages their
    meaning (a sliding window, a chunk, a state's shapes, dtypes and page), then ``:local``
    when vLLM does not transfer it."""
    moved = set(transfer_group_ids(kv_cache_config))
    return tuple(
        f"{type(group.kv_cache_spec).__name__}:{len(group.layer_names)}"
        + _group_details(group.kv_cache_spec)
        + ("" if i in moved else ":local")
        for i, group in enumerate(kv_cache_config.kv_cache_groups)
    )


def _group_details(spec: object) -> str:
    """``:window=..``, ``:chunk=..`` or a state's ``:state=shapes/dtypes/type/page``."""
    window = getattr(spec, "sliding_window", None)
    if window is not None:
        return f":window={window}"
    chunk = getattr(spec, "attention_chunk_size", None)
    if chunk is not None:
        return f":chunk={chunk}"
    shapes = getattr(spec, "shapes", None)
    if shapes is None:
        return ""
    dtypes = ",".join(str(d).removeprefix("torch.") for d in getattr(spec, "dtypes", ()))
    kind = getattr(spec, "mamba_type", "")
    page = getattr(spec, "page_size_bytes", 0)
    return f"{STATE_GROUP_MARK}{list(map(list, shapes))}/{dtypes}/{kind}/{page}"
