"""Who this engine and worker are, derived from the vLLM configuration."""

from __future__ import annotations

from typing import TYPE_CHECKING

from moriio.bootstrap import WorkerIdentity
from moriio.config.settings import ConnectorSettings
from moriio.domain.params.transfer_params import MAX_INSTANCE_ID_LEN, port_offset
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.log import get_logger

if TYPE_CHECKING:
    from vllm.config import ParallelConfig, VllmConfig

log = get_logger("moriio.vllm")


def resolve_host(settings: ConnectorSettings) -> str:
    if settings.host_ip:
        return settings.host_ip
    from vllm.utils.network_utils import get_ip

    return get_ip()


def listen_host(settings: ConnectorSettings, host: str) -> str:
    """Where the control channels listen: ``listen_host``, all interfaces by default."""
    chosen = settings.listen_host
    if chosen is not None and chosen != "*":
        return chosen
    return "::" if ":" in host else "0.0.0.0"


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
    dp_rank = data_parallel(vllm_config.parallel_config)[0]
    log.warning("the vLLM config has no instance_id: peers cannot tell a restart of this engine")
    return f"{resolve_host(settings)}:{settings.handshake_port}:dp{dp_rank}"


def engine_endpoint(settings: ConnectorSettings, vllm_config: VllmConfig) -> LocalEndpoint:
    """What a producer advertises in the params it returns (base ports of rank 0)."""
    host = resolve_host(settings)
    parallel = vllm_config.parallel_config
    dp_rank, dp_size, dp_size_local = data_parallel(parallel)
    return LocalEndpoint(
        engine_id=f"{host}:{settings.handshake_port}",
        host=host,
        handshake_port=settings.handshake_port,
        notify_port=settings.notify_port,
        tp_size=parallel.tensor_parallel_size,
        dp_size=dp_size,
        dp_rank=dp_rank,
        instance_id=engine_instance_id(settings, vllm_config),
        dp_size_local=dp_size_local,
    )


def data_parallel(parallel: ParallelConfig) -> tuple[int, int, int]:
    """This engine's global DP rank, the DP size and the DP ranks per node (0: unknown).

    vLLM runs each DP rank of a dense (non-MoE) model as an independent engine: it resets
    ``data_parallel_rank``, ``_size`` and ``_size_local`` to 0, 1 and 1, keeps the rank in
    ``data_parallel_index`` (vLLM's NixlConnector offsets its ports by it too) and the size
    in ``elastic_ep_max_dp_size``; the ranks per node are lost then.
    """
    rank = int(getattr(parallel, "data_parallel_index", parallel.data_parallel_rank))
    size, local = parallel.data_parallel_size, parallel.data_parallel_size_local
    original_size = int(getattr(parallel, "elastic_ep_max_dp_size", None) or size)
    if size == 1 and (original_size > 1 or rank > 0):  # an independent rank of a DP engine
        return rank, max(original_size, rank + 1), 0
    return rank, size, local


def worker_identity(
    settings: ConnectorSettings,
    vllm_config: VllmConfig,
    *,
    tp_rank: int,
    fingerprint: Fingerprint,
    pp_rank: int | None = None,
) -> WorkerIdentity:
    """Who this worker is; its ports are offset by its DP, PP and TP ranks, its engine name
    carries all three (two pipeline stages on one host never share a port or a name)."""
    parallel = vllm_config.parallel_config
    tp_size = parallel.tensor_parallel_size
    dp_rank = data_parallel(parallel)[0]
    pp_size = parallel.pipeline_parallel_size
    pp = pipeline_rank() if pp_rank is None else pp_rank
    offset = port_offset(dp_rank, tp_rank, tp_size, pp, pp_size)
    host = resolve_host(settings)
    kv_config = vllm_config.kv_transfer_config
    assert kv_config is not None
    role = "producer" if kv_config.is_kv_producer else "consumer"
    ranks = f"tp{tp_rank}:dp{dp_rank}" + (f":pp{pp}" if pp_size > 1 else "")
    return WorkerIdentity(
        engine_name=f"moriio-{role}:{host}:{settings.handshake_port}:{ranks}",
        host=host,
        bind_host=listen_host(settings, host),
        handshake_port=settings.handshake_port + offset,
        notify_port=settings.notify_port + offset,
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_rank=dp_rank,
        is_producer=kv_config.is_kv_producer,
        is_consumer=kv_config.is_kv_consumer,
        fingerprint=fingerprint,
        instance_id=engine_instance_id(settings, vllm_config),
        pp_rank=pp,
        pp_size=pp_size,
    )


def pipeline_rank() -> int:
    """This worker's pipeline stage (0 where vLLM's parallel groups are not initialised)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group

        return int(get_pp_group().rank_in_group)
    except (AssertionError, RuntimeError, ValueError, AttributeError):
        return 0
