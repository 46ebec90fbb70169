"""Composition root of both halves of the connector.

Worker half: picks the adapters (and their shutdown order), wraps them in chaos mode when
``chaos_seed`` is set, and :func:`bootstrap` wires the worker on them. One container per
connector instance, built when the KV caches are known; nothing here is created at import
time. Engines and sockets are resources: ``shutdown()`` closes them all. Tests pass another
:class:`~moriio.adapter_container.AdapterContainer` (e.g. in-memory), or override single
providers of the production one.

Scheduler half: :class:`SchedulerContainer` composes an engine's books and clock from its
settings and :class:`SchedulerRole`; tests and the simulation override single providers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dependency_injector import containers, providers

from moriio.adapter_container import AdapterContainer, open_ports
from moriio.adapters.chaos import ChaosMode
from moriio.adapters.clock import SystemClock, SystemWallClock
from moriio.adapters.zmq import ZmqControlChannel
from moriio.bootstrap import HandshakeTiming, Worker, WorkerIdentity, bootstrap
from moriio.config.settings import ConnectorSettings, Transport
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Message
from moriio.domain.scheduler.consumer.book import ConsumerBook
from moriio.domain.scheduler.producer import by_mode
from moriio.domain.scheduler.producer.book import LocalEndpoint, ProducerBook
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.worker.kv_registry import LayerTensor, LocalKV
from moriio.domain.worker.service import WorkerService
from moriio.ports import Clock, ControlChannel, TransferEngine

MAX_CONTROL_FRAME_BYTES = 8 << 20  # handshakes carry engine metadata and region descriptors
PartT = TypeVar("PartT")


def _zmq_channel(
    host: str, advertise: str, port: int, settings: ConnectorSettings, secret: bytes | None
) -> Iterator[ControlChannel[Message]]:
    channel: ZmqControlChannel[Message] = ZmqControlChannel(
        WIRE_CODEC,
        host,
        port,
        trusted_hosts=settings.trusted_remote_hosts,
        trust_any=settings.trust_any_host,
        secret=secret,
        advertise_host=advertise,
        max_frame_bytes=MAX_CONTROL_FRAME_BYTES,
    )
    try:
        yield channel
    finally:
        channel.close()


def _nixl_engine(identity: WorkerIdentity) -> Iterator[TransferEngine]:
    from moriio.adapters.nixl import NixlTransferEngine

    engine = NixlTransferEngine(identity.engine_name, host=identity.host)
    try:
        yield engine
    finally:
        engine.close()


def _mori_engine(identity: WorkerIdentity, settings: ConnectorSettings) -> Iterator[TransferEngine]:
    from moriio.adapters.mori import MoriTransferEngine

    engine = MoriTransferEngine(
        identity.engine_name,
        host=identity.host,
        backend=settings.backend.value,
        qp_per_transfer=settings.qp_per_transfer,
        post_batch_size=settings.post_batch_size,
        num_worker_threads=settings.num_workers,
    )
    try:
        yield engine
    finally:
        engine.close()


class ZmqAdapters(AdapterContainer):
    """Clock and the two control channels (handshake + notify), shared by every transport."""

    clock: providers.Provider[Clock] = providers.Singleton(SystemClock)
    wall_clock: providers.Provider[Clock | None] = providers.Singleton(SystemWallClock)
    notify_channel = providers.Resource(
        _zmq_channel,
        AdapterContainer.identity.provided.bind_host,
        AdapterContainer.identity.provided.host,
        AdapterContainer.identity.provided.notify_port,
        AdapterContainer.settings,
        AdapterContainer.secret,
    )
    handshake_channel = providers.Resource(
        _zmq_channel,
        AdapterContainer.identity.provided.bind_host,
        AdapterContainer.identity.provided.host,
        AdapterContainer.identity.provided.handshake_port,
        AdapterContainer.settings,
        AdapterContainer.secret,
    )


class NixlAdapters(ZmqAdapters):
    engine = providers.Resource(_nixl_engine, ZmqAdapters.identity)


class MoriAdapters(ZmqAdapters):
    engine = providers.Resource(_mori_engine, ZmqAdapters.identity, ZmqAdapters.settings)


class WorkerRuntime:
    """A wired worker: the service plus one call that releases every resource."""

    def __init__(self, adapters: AdapterContainer, worker: Worker, engine: TransferEngine) -> None:
        self._adapters = adapters
        self._engine = engine  # the adapters' engine, or what wraps it
        self.worker = worker
        self.service: WorkerService = worker.service
        self._closed = False

    def release_kv(self) -> None:
        """Deregister the KV memory (sleep mode, once the service retired it and drained)."""
        self.worker.context.kv.deregister(self._engine)

    def restore_kv(self, tensors: Sequence[LayerTensor]) -> None:
        """Register the KV memory again (after a wake; it may lie elsewhere now) and serve it
        under the next registration generation. ValueError when its layout changed."""
        self.release_kv()  # once: a sleep that did not finish left it registered
        local = LocalKV.register(self._engine, tensors)
        if not local.same_layout(self.worker.context.kv):
            local.deregister(self._engine)
            raise ValueError("the KV cache has other layers or layouts after the wake")
        self.service.wake(local)

    def shutdown(self) -> None:
        """Stop the service, deregister the KV, then close the adapters (engine last)."""
        if self._closed:
            return
        self._closed = True
        self.worker.close(self._engine)
        if self._engine is not self._adapters.engine():
            self._engine.close()  # the wrapper's own resources; the adapters close the rest
        self._adapters.shutdown_resources()


def transport_adapters(
    settings: ConnectorSettings, identity: WorkerIdentity, secret: bytes | None
) -> ZmqAdapters:
    """The production adapters for ``settings.transport`` (not yet initialised)."""
    kind = NixlAdapters if settings.transport is Transport.NIXL else MoriAdapters
    return kind(settings=settings, identity=identity, secret=secret)


def build_worker(
    settings: ConnectorSettings,
    identity: WorkerIdentity,
    tensors: Sequence[LayerTensor],
    *,
    secret: bytes | None = None,
    adapters: AdapterContainer | None = None,
) -> WorkerRuntime:
    """Wire a worker for ``settings.transport`` (or on the given adapter container); in
    chaos mode its engine and notify channel inject seeded faults."""
    if adapters is None:
        adapters = transport_adapters(settings, identity, secret)
    adapters.init_resources()
    try:
        if settings.chaos_seed is None:
            ports = open_ports(adapters)
        else:
            chaos = ChaosMode(settings.chaos_seed, identity.engine_name)
            ports = open_ports(adapters, wrap_first=chaos.engine)
            ports = dataclasses.replace(ports, notify=chaos.channel(ports.notify, ports.clock))
        worker = bootstrap(
            ports,
            identity,
            tensors,
            mode=settings.mode,
            policy=settings.transfer_policy(),
            handshakes=HandshakeTiming(
                settings.handshake_timeout,
                settings.handshake_retry_after,
                settings.handshake_max_retry_after,
            ),
        )
        return WorkerRuntime(adapters, worker, ports.engine)
    except BaseException:
        adapters.shutdown_resources()
        raise


@dataclass(frozen=True, slots=True)
class SchedulerRole:
    """Which books an engine's scheduler keeps (both for vLLM's ``kv_both``)."""

    is_producer: bool
    is_consumer: bool


def _when(active: bool, part: Callable[[], PartT]) -> PartT | None:
    """``part()`` if the role has it, else None (a part the role lacks is never built)."""
    return part() if active else None


class SchedulerContainer(containers.DeclarativeContainer):
    """The scheduler half of one engine: its books and clock, resolved once at start-up.

    ``producer`` and ``consumer`` are the books the role keeps (None: not kept); override
    ``producer_book``, ``consumer_book``, ``clock`` or ``policy`` to replace a part.
    ``endpoint`` is read by a producer only. ``prefill_backoff``: trailing prompt tokens a
    prefill leaves to its decode (1 for a model with Mamba / linear-attention state);
    ``null_positions``: whether a block list may hold vLLM's null block.
    """

    settings = providers.Dependency(instance_of=ConnectorSettings)
    role = providers.Dependency(instance_of=SchedulerRole)
    endpoint = providers.Dependency(instance_of=LocalEndpoint)
    block_size = providers.Dependency(instance_of=int)
    prefill_backoff: providers.Provider[int] = providers.Object(0)
    null_positions: providers.Provider[bool] = providers.Object(True)
    clock: providers.Provider[Clock] = providers.Singleton(SystemClock)
    policy: providers.Provider[TransferPolicy] = providers.Singleton(
        ConnectorSettings.transfer_policy, settings
    )
    producer_book: providers.Provider[ProducerBook] = providers.Singleton(
        by_mode.producer_book, settings.provided.mode, endpoint, policy
    )
    consumer_book: providers.Provider[ConsumerBook] = providers.Singleton(
        ConsumerBook,
        settings.provided.mode,
        block_size,
        settings.provided.load_mode,
        prefill_backoff,
        null_positions,
    )
    producer: providers.Provider[ProducerBook | None] = providers.Singleton(
        _when, role.provided.is_producer, producer_book.provider
    )
    consumer: providers.Provider[ConsumerBook | None] = providers.Singleton(
        _when, role.provided.is_consumer, consumer_book.provider
    )


__all__ = [
    "MoriAdapters",
    "NixlAdapters",
    "SchedulerContainer",
    "SchedulerRole",
    "WorkerRuntime",
    "ZmqAdapters",
    "build_worker",
    "transport_adapters",
]
