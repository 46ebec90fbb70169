"""Worker-role half of the connector: torch tensors and vLLM hooks -> the worker service."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from dependency_injector import providers

from moriio.adapter_container import AdapterContainer
from moriio.adapters.device.same_host import same_host_wrapper
from moriio.adapters.device.stream_gates import is_capturing, probe_stream_gates
from moriio.adapters.device.streams import TorchFences, current_device, device_binder
from moriio.bootstrap import WorkerIdentity
from moriio.config.settings import ConnectorSettings, LayerBarrier, Transport
from moriio.container import WorkerRuntime, build_worker, transport_adapters
from moriio.domain.params.orders import StepOrders
from moriio.domain.values.modes import LoadMode, TransferMode
from moriio.domain.worker.consumer.gate_book import GateBook
from moriio.domain.worker.progress import WorkerProgress
from moriio.domain.worker.service import StepReport, WorkerService
from moriio.domain.worker.stats import WorkerStats
from moriio.log import get_logger
from moriio.ports import LayerGates, MemoryKind
from moriio.vllm_plugin import sleep_mode
from moriio.vllm_plugin.fingerprint import engine_fingerprint
from moriio.vllm_plugin.identity import worker_identity
from moriio.vllm_plugin.kv_views import (
    ResolvedLayer,
    layer_backends,
    resolve_layers,
    transfer_specs,
)
from moriio.vllm_plugin.tp_slicing import with_slicing
from moriio.vllm_plugin.tracing import RequestTrace
from moriio.vllm_plugin.ucx_report import log_device_protocols

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

log = get_logger("moriio.vllm")


def load_secret(settings: ConnectorSettings) -> bytes | None:
    """The shared HMAC secret from the configured environment variable or file."""
    if settings.shared_secret_env:
        value = os.environ.get(settings.shared_secret_env)
        if not value:
            raise ValueError(
                f"shared_secret_env names {settings.shared_secret_env!r}, which is unset or empty"
            )
        return value.encode()
    if settings.shared_secret_file:
        data = Path(settings.shared_secret_file).read_bytes().strip()
        if not data:
            raise ValueError(f"shared_secret_file {settings.shared_secret_file!r} is empty")
        return data
    return None


class WorkerSide:
    """One per worker process."""

    def __init__(
        self,
        settings: ConnectorSettings,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        *,
        tp_rank: int,
        full_graph: Callable[[], bool] = lambda: False,
    ) -> None:
        """``full_graph``: whether the forward running now replays a FULL CUDA graph (read
        per forward: per-layer hooks do not run inside one)."""
        self._settings = settings
        self._vllm_config = vllm_config
        self._kv_cache_config = kv_cache_config
        self._tp_rank = tp_rank
        self._full_graph = full_graph
        self._runtime: WorkerRuntime | None = None
        self._progress: WorkerProgress | None = None
        self._pending: StepOrders | None = None
        self._computes = True
        self._on_device = False
        self._gates: LayerGates | None = None  # the forward's stream waits on these
        self._kv_caches: dict[str, torch.Tensor] = {}  # registered again after a wake
        self._backends: dict[str, str] = {}
        self._handoff_key: bytes | None = None  # the engine's, from its scheduler
        self._trace = RequestTrace.from_env("engine-worker")
        # The transport's adapters plus the KV's device; tests and simulations build other
        # adapters (e.g. in-memory) for the same identity.
        self.adapters_factory: (
            Callable[[ConnectorSettings, WorkerIdentity, bytes | None], AdapterContainer] | None
        ) = self._device_adapters

    def _device_adapters(
        self, settings: ConnectorSettings, identity: WorkerIdentity, secret: bytes | None
    ) -> AdapterContainer:
        """The transport's adapters; for KV in device memory, with fences on the device's
        streams and the call that binds the worker's threads to the device."""
        adapters = transport_adapters(settings, identity, secret)
        device = current_device()
        if self._on_device and device.type != "cpu":
            adapters.fences.override(providers.Object(TorchFences(device)))
            adapters.bind_device.override(providers.Object(device_binder(device)))
            adapters.layer_gates.override(providers.Object(self._gates))
            # Off: nothing is shared, but same-host peers' envelopes are still read.
            share = settings.same_host_copies
            wrapper = same_host_wrapper(device, share=share, gates=self._gates)
            adapters.engine_wrapper.override(providers.Object(wrapper))
        return adapters

    @property
    def service(self) -> WorkerService | None:
        return None if self._runtime is None else self._runtime.service

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        config = self._kv_cache_config
        backends = layer_backends(self._vllm_config, list(kv_caches))
        self._kv_caches, self._backends = dict(kv_caches), backends
        layers = self._resolve_layers()
        tensors = [layer.tensor for layer in layers]
        fingerprint = engine_fingerprint(self._settings, self._vllm_config, config, layers)
        identity = worker_identity(
            self._settings, self._vllm_config, tp_rank=self._tp_rank, fingerprint=fingerprint
        )
        self._on_device = any(t.kind is MemoryKind.DEVICE for t in tensors)
        if self._on_device:
            self._gates = self._layer_gates(len(tensors))
        secret = load_secret(self._settings)
        factory = self.adapters_factory
        adapters = None if factory is None else factory(self._settings, identity, secret)
        self._runtime = build_worker(
            self._settings, identity, tensors, secret=secret, adapters=adapters
        )
        self._give_key()
        self._progress = WorkerProgress(
            self._runtime.service, busy_interval=self._settings.progress_interval
        )
        self._progress.start()
        if self._on_device and self._settings.transport is Transport.NIXL:
            log_device_protocols(current_device())
        log.info(
            "moriio worker ready",
            layers=len(tensors),
            control=str(self._runtime.service.ctx.control),
            tp_rank=self._tp_rank,
            page_order=fingerprint.kv_layout,
            cache_dtype=fingerprint.cache_dtype,
            backend=fingerprint.attn_backend,
            layouts=",".join(sorted(set(fingerprint.layout_kinds))),
        )

    def _layer_gates(self, layers: int) -> LayerGates | None:
        """Gates on the device's stream for a layerwise READ consumer, where the device can
        wait on them (``layer_barrier``); None: the forward thread waits instead."""
        settings = self._settings
        layerwise = settings.mode is TransferMode.READ and settings.load_mode is LoadMode.LAYERWISE
        kv_config = self._vllm_config.kv_transfer_config
        is_consumer = kv_config is not None and kv_config.is_kv_consumer
        if not (layerwise and is_consumer) or settings.layer_barrier is LayerBarrier.HOST:
            return None
        gates = probe_stream_gates(current_device(), layers)
        if isinstance(gates, str):
            if settings.layer_barrier is LayerBarrier.DEVICE:
                raise RuntimeError(f"layer_barrier device: this device cannot wait on it: {gates}")
            log.warning(
                "layer barrier on the host: FULL CUDA graph batches wait for their KV before "
                "the forward; eager and piecewise batches wait layer by layer",
                reason=gates,
            )
            return None
        log.info("layer barrier on the device stream (FULL CUDA graphs capture it)", layers=layers)
        return gates

    @property
    def layer_gates(self) -> LayerGates | None:
        """The gates the forward's device stream waits on (None: the host waits)."""
        return self._gates

    def captures_layer_waits(self) -> bool:
        """Whether a layer's hook must run now to put its wait into a graph being captured."""
        return self._gates is not None and is_capturing()

    @property
    def progress(self) -> WorkerProgress | None:
        return self._progress

    def bind(
        self, orders: StepOrders, *, computes: bool = True, handoff_key: bytes | None = None
    ) -> None:
        """This step's orders; ``computes`` False: the step schedules no token.
        ``handoff_key``: the key the engine's scheduler signs hand-offs with."""
        self._pending = orders
        self._computes = computes
        if handoff_key is not None and handoff_key != self._handoff_key:
            self._handoff_key = handoff_key
            self._give_key()

    def _give_key(self) -> None:
        """Answer peers' handshakes with the engine's hand-off key from now on."""
        if self.service is not None and self._handoff_key is not None:
            self.service.set_handoff_key(self._handoff_key)

    def start_load_kv(self) -> None:
        with self._lock():
            service = self._apply_orders()
            if service is not None and self._gates is None and self._full_graph():
                service.wait_for_all_reads()  # per-layer hooks do not run inside a full graph

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Called for every attention layer of every forward: returns at once, without the
        lock, unless orders are pending or a layerwise read is live (only this thread starts
        one, in the orders it applies). With layer gates, the device waits, not this thread."""
        if self._gates is not None:
            self._enqueue_layer_wait(self._gates, layer_name)
            return
        if self._pending is None:
            service = self.service
            consumer = None if service is None else service.consumer
            if consumer is None or not consumer.has_live_reads():
                return
        with self._lock():
            service = self._apply_orders()
            if service is not None and not self._full_graph():
                service.wait_for_layer(layer_name)

    def _enqueue_layer_wait(self, gates: LayerGates, layer_name: str) -> None:
        """Queue the device's wait for the layer's gate: always while a graph is captured
        (every replay waits; an open gate costs a few microseconds), otherwise only while
        a forward's gates are armed."""
        book = self._gate_book()
        if book is None:
            return
        index = book.index_of(layer_name)
        if index is None:
            return
        if not is_capturing():
            if self._pending is not None:
                with self._lock():
                    self._apply_orders()
            if not book.armed:
                return
        gates.enqueue_wait(index)

    def _gate_book(self) -> GateBook | None:
        service = self.service
        return None if service is None or service.consumer is None else service.consumer.gates

    def save_kv_layer(self, layer_name: str) -> None:
        """WRITE producers only: queue the layer behind a fence on its stream (device KV)
        or write it now (host KV). Never waits for the device."""
        service = self._write_producer()
        if service is not None:
            with self._lock():
                self._apply_orders()
                service.save_layer(layer_name)
                self._nudge()

    def wait_for_save(self) -> None:
        """WRITE producers only: the forward's transfers are sealed once its device work
        ran (a fence, not a wait). Other roles return at once."""
        service = self._write_producer()
        if service is not None:
            with self._lock():
                self._apply_orders()
                service.end_forward()
                self._nudge()

    def finish_step(self) -> StepReport:
        """What finished. On a decode, a step that computes nothing while loads are live
        waits up to ``idle_step_wait`` for one to finish first: vLLM steps such an engine
        again 1 ms after each return, a loop that would spin a core for as long as the loads
        last. A prefill holding hand-offs does not wait: its next request would wait too."""
        report, loading = self._take_report()
        progress, wait = self._progress, self._settings.idle_step_wait
        idle = not self._computes and report.is_empty()
        if loading and idle and progress is not None and wait > 0:
            progress.news.wait(wait)
            report, _ = self._take_report()
        if self._trace is not None:
            self._trace.events(report.finished_recving, "landed", last=True)
            self._trace.events(report.finished_sending, "sent", last=True)
        return report

    def _take_report(self) -> tuple[StepReport, bool]:
        """The report, and whether loads are still live; clears the progress thread's news
        under its lock, so that only what it finds after the report sets it again."""
        with self._lock():
            service = self._apply_orders()
            if service is None:
                return StepReport(), False
            if self._gates is not None:  # this forward's load errors belong to this step
                service.wait_for_all_reads()
            report = service.finish_step()
            if self._progress is not None:
                self._progress.news.clear()
            return report, service.consumer is not None and service.consumer.num_live > 0

    def take_stats(self) -> WorkerStats | None:
        """The worker's stats and the duration samples since the previous take (None before
        the KV caches are registered)."""
        with self._lock():
            service = self.service
            return None if service is None else service.take_stats()

    # -- sleep mode (vLLM 0.33 calls these; see moriio.vllm_plugin.sleep_mode) ---------------

    def unregister_kv_caches(self) -> None:
        """The KV memory is about to be released: stop every transfer touching it, tell the
        peers holding it, and deregister it once they confirmed (blocks until then)."""
        if self._runtime is not None:
            sleep_mode.unregister(self._runtime, self._lock, self._settings.transfer_policy())

    def restore_kv_caches(self) -> None:
        """The KV memory is allocated again (maybe elsewhere): register it again under the
        next registration generation."""
        if self._runtime is not None:
            layers = self._resolve_layers()
            sleep_mode.restore(self._runtime, self._lock, [layer.tensor for layer in layers])

    def _resolve_layers(self) -> list[ResolvedLayer]:
        """The registered KV caches' layers, with each one's TP slicing."""
        config = self._kv_cache_config
        return with_slicing(
            resolve_layers(self._kv_caches, config, self._backends),
            self._vllm_config,
            config,
            transfer_specs(config),
        )

    def handshake_metadata(self) -> sleep_mode.MoriioHandshakeMetadata | None:
        """The generation the KV memory is registered under (None before registration)."""
        service = self.service
        generation = None if service is None else service.ctx.peers.generation
        return None if generation is None else sleep_mode.MoriioHandshakeMetadata(generation)

    def shutdown(self) -> None:
        book = self._gate_book()
        if book is not None:
            book.open_all()  # nothing may wait on them any longer
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._runtime is not None:
            self._runtime.shutdown()
            self._runtime = None

    def _write_producer(self) -> WorkerService | None:
        service = self.service
        if service is None or service.mode is not TransferMode.WRITE or service.producer is None:
            return None
        return service

    def _lock(self) -> AbstractContextManager[object]:
        """The progress thread's lock (a no-op before the KV caches are registered)."""
        return self._progress.lock if self._progress is not None else nullcontext()

    def _apply_orders(self) -> WorkerService | None:
        service = self.service
        orders, self._pending = self._pending, None
        if service is not None and orders is not None and not orders.is_empty():
            service.start_step(orders, time.time())
            self._nudge()
            if self._trace is not None:
                self._trace.orders(orders)
        return service

    def _nudge(self) -> None:
        """Work this hook made live gets the progress thread's attention (lock held)."""
        if self._progress is not None:
            self._progress.nudge()
