"""Who this engine and worker are, derived from the vLLM configuration."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from moriio.config.settings import ConnectorSettings
from moriio.container import WorkerIdentity
from moriio.domain.kv.layout import LayerSpec
from moriio.domain.scheduler.producer_book import LocalEndpoint
from moriio.domain.wire.handshake import Fingerprint
from moriio.domain.wire.transfer_params import MAX_INSTANCE_ID_LEN, port_offset
from moriio.log import get_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

log = get_logger("moriio.vllm")


def resolve_host(settings: ConnectorSettings) -> str:
    if settings.host_ip:
        return settings.host_ip
    from vllm.utils.network_utils import get_ip

    return get_ip()


def engine_instance_id(settings: ConnectorSettings, vllm_config: VllmConfig) -> str:
    """This engine's incarnation, the same in its scheduler and in every one of its workers.

    vLLM stamps ``VllmConfig.instance_id`` when it builds the config of an engine start (a
    timestamp, suffixed ``_dp<rank>`` per data-parallel engine) and hands that config to the
    scheduler and to every worker, so both roles read the same value and it changes on
    every restart. A config without one (built by hand) falls back to the engine's address
    and DP rank: the roles still agree, but a restart on the same address goes unnoticed.
    """
    instance = str(vllm_config.instance_id or "")[:MAX_INSTANCE_ID_LEN]
    if instance:
        return instance
    dp_rank = vllm_config.parallel_config.data_parallel_rank
    log.warning("the vLLM config has no instance_id: peers cannot tell a restart of this engine")
    return f"{resolve_host(settings)}:{settings.handshake_port}:dp{dp_rank}"


def engine_endpoint(settings: ConnectorSettings, vllm_config: VllmConfig) -> LocalEndpoint:
    """What a producer advertises in the params it returns (base ports of rank 0)."""
    host = resolve_host(settings)
    parallel = vllm_config.parallel_config
    return LocalEndpoint(
        engine_id=f"{host}:{settings.handshake_port}",
        host=host,
        handshake_port=settings.handshake_port,
        notify_port=settings.notify_port,
        tp_size=parallel.tensor_parallel_size,
        dp_size=parallel.data_parallel_size,
        dp_rank=parallel.data_parallel_rank,
        instance_id=engine_instance_id(settings, vllm_config),
    )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def layer_specs(kv_cache_config: KVCacheConfig) -> dict[str, KVCacheSpec]:
    specs: dict[str, KVCacheSpec] = {}
    for group in kv_cache_config.kv_cache_groups:
        for name in group.layer_names:
            specs[name] = group.kv_cache_spec
    return specs


def to_layer_spec(spec: KVCacheSpec) -> LayerSpec:
    from vllm.v1.kv_cache_interface import AttentionSpec, MLAAttentionSpec

    if isinstance(spec, MLAAttentionSpec):
        return LayerSpec(spec.block_size, 1, spec.head_size, "mla")
    if isinstance(spec, AttentionSpec):
        head_v = spec.head_size_v if spec.head_size_v not in (None, spec.head_size) else None
        return LayerSpec(spec.block_size, spec.num_kv_heads, spec.head_size, "attention", head_v)
    raise ValueError(f"unsupported KV cache spec {type(spec).__name__}: only attention and MLA")


def worker_identity(
    settings: ConnectorSettings,
    vllm_config: VllmConfig,
    *,
    tp_rank: int,
    layout_kinds: tuple[str, ...],
    dtype: str,
    is_mla: bool,
) -> WorkerIdentity:
    parallel = vllm_config.parallel_config
    model = vllm_config.model_config
    tp_size = parallel.tensor_parallel_size
    dp_rank = parallel.data_parallel_rank
    offset = port_offset(dp_rank, tp_rank, tp_size)
    host = resolve_host(settings)
    kv_config = vllm_config.kv_transfer_config
    assert kv_config is not None
    role = "producer" if kv_config.is_kv_producer else "consumer"
    return WorkerIdentity(
        engine_name=f"moriio-{role}:{host}:{settings.handshake_port}:tp{tp_rank}:dp{dp_rank}",
        host=host,
        bind_host=host,
        handshake_port=settings.handshake_port + offset,
        notify_port=settings.notify_port + offset,
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_rank=dp_rank,
        is_producer=kv_config.is_kv_producer,
        is_consumer=kv_config.is_kv_consumer,
        fingerprint=Fingerprint(
            model_name=str(model.model),
            dtype=dtype,
            block_size=vllm_config.cache_config.block_size,
            layout_kinds=layout_kinds,
            tp_size=tp_size,
            transfer_mode=settings.mode,
            total_num_kv_heads=max(1, model.get_total_num_kv_heads()),
            is_mla=is_mla,
        ),
        instance_id=engine_instance_id(settings, vllm_config),
    )
