"""``MoriioKVConnector``: vLLM's KVConnectorBase_V1 for both roles, READ and WRITE modes.

Select it with ``kv_connector="MoriioKVConnector"`` and
``kv_connector_module_path="moriio.vllm_plugin"``. The class is a thin facade: scheduler
bookkeeping lives in :mod:`moriio.domain.scheduler`, transfers in :mod:`moriio.domain.worker`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)

from moriio.config.keys import env_notes
from moriio.config.settings import (
    ConnectorSettings,
    LayerBarrier,
    parse_settings,
    settings_by_key,
    transport_choice,
)
from moriio.container import SchedulerContainer, SchedulerRole
from moriio.domain.kv.block_groups import NULL_BLOCK
from moriio.domain.values.modes import LoadMode
from moriio.log import get_logger
from moriio.vllm_plugin.discovery import RouterHeartbeat, start_heartbeat
from moriio.vllm_plugin.identity import engine_endpoint
from moriio.vllm_plugin.kv_views import (
    check_transferable,
    frees_positions,
    has_state_groups,
    transfer_group_ids,
)
from moriio.vllm_plugin.logs import route_logs_to_vllm
from moriio.vllm_plugin.metadata import MoriioConnectorMetadata
from moriio.vllm_plugin.prompt_binding import PromptBinder
from moriio.vllm_plugin.scheduler_side import SchedulerSide
from moriio.vllm_plugin.sleep_mode import registration_generation
from moriio.vllm_plugin.stats import MoriioKVConnectorStats, MoriioPromMetrics, StatsTracker
from moriio.vllm_plugin.support import (
    check_hybrid_settings,
    check_supported,
    forward_is_full_graph,
    full_cudagraphs,
)
from moriio.vllm_plugin.tracing import RequestTrace
from moriio.vllm_plugin.vllm_facts import sleep_mode_refusal
from moriio.vllm_plugin.worker_side import WorkerSide

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = get_logger("moriio.vllm")
_warned_full_graphs = False


def load_settings(vllm_config: VllmConfig) -> ConnectorSettings:
    """Validated settings (SettingsError names a bad or unknown key); logs how ``transport``
    was decided and warns about the in-tree connector's environment variables."""
    kv_config = vllm_config.kv_transfer_config
    assert kv_config is not None
    extra = kv_config.kv_connector_extra_config
    settings = parse_settings(extra)
    log.info(
        "connector settings",
        transport=settings.transport.value,
        decided=transport_choice(extra),
        mode=settings.mode.value,
    )
    for note in env_notes(os.environ, settings_by_key(settings)):
        log.warning("ignoring an in-tree MoRIIO environment variable", detail=note)
    return settings


_PER_REQUEST_HOOKS = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "request_finished",
    "request_finished_all_groups",
    "on_new_request",
)


class MoriioKVConnector(KVConnectorBase_V1, SupportsHMA):
    """KV transfer over mori RDMA (AMD) or NIXL (NVIDIA, CPU) for P/D disaggregation.

    Supports vLLM's hybrid KV-cache manager: every transferred group's blocks move (see
    :mod:`moriio.domain.kv.block_groups`).
    """

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        route_logs_to_vllm()
        self.settings = load_settings(vllm_config)
        self._transfer_groups: tuple[int, ...] = ()
        if kv_cache_config is not None:
            check_transferable(kv_cache_config)
            check_hybrid_settings(self.settings, kv_cache_config)
            self._transfer_groups = transfer_group_ids(kv_cache_config)
        check_supported(vllm_config, settings=self.settings)
        kv_config = vllm_config.kv_transfer_config
        assert kv_config is not None
        self._stats = StatsTracker()
        self.scheduler_side: SchedulerSide | None = None
        self.worker_side: WorkerSide | None = None
        self._load_errors: set[int] = set()
        self.heartbeat: RouterHeartbeat | None = None
        if role == KVConnectorRole.SCHEDULER:
            endpoint = engine_endpoint(self.settings, vllm_config)
            parts = SchedulerContainer(
                settings=self.settings,
                role=SchedulerRole(kv_config.is_kv_producer, kv_config.is_kv_consumer),
                endpoint=endpoint,
                block_size=vllm_config.cache_config.block_size,
                prefill_backoff=1 if kv_cache_config and has_state_groups(kv_cache_config) else 0,
                null_positions=kv_cache_config is None or frees_positions(kv_cache_config),
            )
            self.scheduler_side = SchedulerSide(
                parts,
                trace=RequestTrace.from_env("engine-scheduler"),
                transfer_groups=_selected(kv_cache_config),
                prompts=PromptBinder.from_config(vllm_config, kv_cache_config),
            )
            self.heartbeat = start_heartbeat(self.settings, endpoint, kv_config.is_kv_producer)
            # vLLM calls these once per request: bound straight to the scheduler side, so
            # each call is one Python frame, not three (unless a subclass overrides one).
            for hook in _PER_REQUEST_HOOKS:
                if getattr(type(self), hook) is getattr(MoriioKVConnector, hook):
                    setattr(self, hook, getattr(self.scheduler_side, hook))
        else:
            layerwise = self.settings.load_mode is LoadMode.LAYERWISE
            on_host = self.settings.layer_barrier is LayerBarrier.HOST
            if full_cudagraphs(vllm_config) and layerwise and on_host and kv_config.is_kv_consumer:
                _warn_full_graphs_once()
            self.worker_side = WorkerSide(
                self.settings,
                vllm_config,
                kv_cache_config,
                tp_rank=_tp_rank(),
                full_graph=forward_is_full_graph,
            )

    # -- class-level hooks ---------------------------------------------------------------

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        """Asked (0.33) before an engine starts with ``--enable-sleep-mode``: True over NIXL,
        False with mori, logging why (vLLM's own error names no reason)."""
        refusal = sleep_mode_refusal(parse_settings(kv_transfer_config.kv_connector_extra_config))
        if refusal is not None:
            log.error("sleep mode refused", reason=refusal)
        return refusal is None

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """The page order ``kv_cache_layout`` names (None: the backends choose). vLLM keeps
        it only where every attention backend of the engine supports it, else warns and
        takes the backends' choice; both peers' orders are compared at the handshake."""
        kv_config = vllm_config.kv_transfer_config
        if kv_config is None:
            return None
        return parse_settings(kv_config.kv_connector_extra_config).kv_cache_layout.vllm_name

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Validate the settings: vLLM calls this while it finalises its configuration,
        before any engine process starts or weights load, so a bad key stops ``vllm serve``
        at once. Never overrides the user's cudagraph mode: FULL graphs capture the
        device-side layer barrier (or, on the host barrier, wait for their reads first)."""
        parse_settings(extra_config)
        return False

    def has_connector_metadata(self) -> bool:
        """Also True while a CUDA graph is captured with layer gates: vLLM binds no metadata
        for capture, and the attention layers must still call ``wait_for_layer_load`` for
        their gate's wait to become part of the graph."""
        if super().has_connector_metadata():
            return True
        worker = self.worker_side
        return worker is not None and worker.captures_layer_waits()

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        return MoriioKVConnectorStats(data=data) if data is not None else MoriioKVConnectorStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return MoriioPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- scheduler side ------------------------------------------------------------------

    def _scheduler(self) -> SchedulerSide:
        if self.scheduler_side is None:
            raise RuntimeError("scheduler-side method called on a worker connector")
        return self.scheduler_side

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._scheduler().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._scheduler().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._scheduler().build_connector_meta(scheduler_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler().request_finished(request, block_ids)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler().request_finished_all_groups(request, block_ids)

    def on_new_request(self, request: Request) -> None:
        self._scheduler().on_new_request(request)

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """A load restores every transferred group (vLLM must not zero those blocks)."""
        return self._transfer_groups

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        expired = self._scheduler().update_connector_output(connector_output)
        self._stats.expired_leases += expired

    def has_pending_push_work(self) -> bool:
        """Keep the engine stepping until orders emitted after its last step reach the
        workers (e.g. the drop of a hand-off reclaimed at its lease while the engine idles)."""
        return self.scheduler_side is not None and self.scheduler_side.has_pending_orders()

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self.scheduler_side is not None:
            self.scheduler_side.bind_kv_cache_manager(kv_cache_manager)

    # -- worker side ---------------------------------------------------------------------

    def _worker(self) -> WorkerSide:
        if self.worker_side is None:
            raise RuntimeError("worker-side method called on a scheduler connector")
        return self.worker_side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker().register_kv_caches(kv_caches)

    def unregister_kv_caches(self) -> None:
        """Before sleep mode releases the KV memory (see :mod:`.sleep_mode`)."""
        self._worker().unregister_kv_caches()

    def restore_kv_caches(self) -> None:
        """After a wake allocated the KV memory again."""
        self._worker().restore_kv_caches()

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        """The registration generation, for this engine's scheduler (vLLM collects it at
        start and, from 0.33, after every wake)."""
        return None if self.worker_side is None else self.worker_side.handshake_metadata()

    def set_xfer_handshake_metadata(
        self, metadata: dict[int, KVConnectorHandshakeMetadata]
    ) -> None:
        self._take_generation(metadata.values())

    def set_xfer_handshake_metadata_pp_aware(
        self, metadata: dict[tuple[int, int], KVConnectorHandshakeMetadata]
    ) -> None:
        self._take_generation(metadata.values())

    def _take_generation(self, metadata: Iterable[KVConnectorHandshakeMetadata]) -> None:
        generation = registration_generation(metadata)
        if generation is not None and self.scheduler_side is not None:
            self.scheduler_side.set_registration_generation(generation)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.worker_side is not None and isinstance(connector_metadata, MoriioConnectorMetadata):
            self.worker_side.bind(
                connector_metadata.orders,
                computes=connector_metadata.computes,
                handoff_key=connector_metadata.handoff_key,
            )

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._worker().start_load_kv()

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker().wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        self._worker().save_kv_layer(layer_name)

    def wait_for_save(self) -> None:
        self._worker().wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        report = self._worker().finish_step()
        if len(self._transfer_groups) <= 1:
            # Block ids name a block only within a group: with several groups vLLM takes
            # failed loads per request only (hybrid loads are asynchronous: failed_recving).
            # The null block is every request's placeholder, never one load's block.
            self._load_errors |= report.invalid_block_ids - {NULL_BLOCK}
        return KVConnectorTransferResults(
            finished_sending=report.finished_sending,
            finished_recving=report.finished_recving,
            failed_recving=report.failed_recving,
        )

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self.scheduler_side is not None:
            self._stats.rejected_params = self.scheduler_side.rejected_params
        worker = self.worker_side.take_stats() if self.worker_side is not None else None
        return self._stats.collect(worker)

    def shutdown(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        if self.worker_side is not None:
            self.worker_side.shutdown()


def _selected(kv_cache_config: KVCacheConfig | None) -> tuple[int, ...] | None:
    """The transferred groups, None when all groups are (the lists are used as they come)."""
    if kv_cache_config is None:
        return None
    ids = transfer_group_ids(kv_cache_config)
    return None if ids == tuple(range(len(kv_cache_config.kv_cache_groups))) else ids


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except (AssertionError, RuntimeError, ValueError):
        return 0  # parallel groups not initialised (single-process tools and tests)


def _warn_full_graphs_once() -> None:
    global _warned_full_graphs
    if not _warned_full_graphs:
        _warned_full_graphs = True
        log.warning(
            "FULL CUDA graphs with load_mode layerwise and layer_barrier host: batches that "
            "replay a FULL graph wait for their KV reads before the forward (no per-layer "
            "overlap); eager and piecewise batches still wait layer by layer"
        )
