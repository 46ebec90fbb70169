"""Composition root: picks the adapters (and their shutdown order); :func:`bootstrap` wires them.

One container per connector instance, built when the KV caches are known; nothing here is
created at import time. Engines and sockets are resources: ``shutdown()`` closes them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from dependency_injector import containers, providers

from moriio.adapters.clock import SystemClock, SystemWallClock
from moriio.adapters.zmq import ZmqControlChannel
from moriio.bootstrap import HandshakeTiming, Worker, WorkerIdentity, WorkerPorts, bootstrap
from moriio.config.settings import ConnectorSettings, Transport
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Message
from moriio.domain.worker.kv_registry import LayerTensor
from moriio.domain.worker.producer.write_fences import HostFences
from moriio.domain.worker.service import WorkerService
from moriio.ports import Clock, ControlChannel, FenceSource, LayerGates, TransferEngine

MAX_CONTROL_FRAME_BYTES = 8 << 20  # handshakes carry engine metadata and region descriptors


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


class ZmqAdapters(containers.DeclarativeContainer):
    """Clock and the two control channels (handshake + notify), shared by every transport."""

    settings = providers.Dependency(instance_of=ConnectorSettings)
    identity = providers.Dependency(instance_of=WorkerIdentity)
    secret: providers.Dependency[bytes | None] = providers.Dependency()
    clock: providers.Provider[Clock] = providers.Singleton(SystemClock)
    wall_clock: providers.Provider[Clock | None] = providers.Singleton(SystemWallClock)
    background_handshakes: providers.Provider[bool] = providers.Object(True)
    # The KV's device: fences on its streams, and the call binding a thread to it (None:
    # host memory). The vLLM plugin overrides both for device KV caches.
    fences: providers.Provider[FenceSource] = providers.Singleton(HostFences)
    bind_device: providers.Provider[Callable[[], None] | None] = providers.Object(None)
    layer_gates: providers.Provider[LayerGates | None] = providers.Object(None)
    # Wraps the transport's engine (the vLLM plugin: same-host device copies); None: as is.
    engine_wrapper: providers.Provider[Callable[[TransferEngine], TransferEngine] | None] = (
        providers.Object(None)
    )
    notify_channel = providers.Resource(
        _zmq_channel,
        identity.provided.bind_host,
        identity.provided.host,
        identity.provided.notify_port,
        settings,
        secret,
    )
    handshake_channel = providers.Resource(
        _zmq_channel,
        identity.provided.bind_host,
        identity.provided.host,
        identity.provided.handshake_port,
        settings,
        secret,
    )


class NixlAdapters(ZmqAdapters):
    engine = providers.Resource(_nixl_engine, ZmqAdapters.identity)


class MoriAdapters(ZmqAdapters):
    engine = providers.Resource(_mori_engine, ZmqAdapters.identity, ZmqAdapters.settings)


def _ports(adapters: Any) -> WorkerPorts:
    """The opened adapters of a container (production, in-memory or chaos-wrapped)."""
    engine = adapters.engine()
    wrap = adapters.engine_wrapper()
    return WorkerPorts(
        engine=engine if wrap is None else wrap(engine),
        notify=adapters.notify_channel(),
        handshake=adapters.handshake_channel(),
        clock=adapters.clock(),
        wall_clock=adapters.wall_clock(),
        fences=adapters.fences(),
        bind_device=adapters.bind_device(),
        layer_gates=adapters.layer_gates(),
        background_handshakes=adapters.background_handshakes(),
    )


class WorkerRuntime:
    """A wired worker: the service plus one call that releases every resource."""

    def __init__(self, adapters: Any, worker: Worker, engine: TransferEngine) -> None:
        self._adapters = adapters
        self._engine = engine  # the adapters' engine, or what wraps it
        self.worker = worker
        self.service: WorkerService = worker.service
        self._closed = False

    def shutdown(self) -> None:
        """Stop the service, deregister the KV, then close the adapters (engine last)."""
        if self._closed:
            return
        self._closed = True
        self.worker.close(self._engine)
        if self._engine is not self._adapters.engine():
            self._engine.close()  # the wrapper's own resources; the adapters close the rest
        self._adapters.shutdown_resources()


# Opt-in fault injection lives in the test kit: it is imported only when ``chaos_seed`` is set,
# so the production path never loads ``moriio.testing`` (an import-linter contract checks it).
CHAOS_WIRING = "moriio.testing.chaos.wiring:enable_chaos"


def _load(dotted: str) -> Callable[..., Any]:
    """The callable named ``module:attribute``."""
    module, _, attribute = dotted.partition(":")
    return cast("Callable[..., Any]", getattr(importlib.import_module(module), attribute))


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
    adapters: Any = None,
) -> WorkerRuntime:
    """Wire a worker for ``settings.transport`` (or for the given adapter container)."""
    if adapters is None:
        adapters = transport_adapters(settings, identity, secret)
    adapters.init_resources()
    try:
        if settings.chaos_seed is not None:
            _load(CHAOS_WIRING)(adapters, settings.chaos_seed, identity.engine_name)
        ports = _ports(adapters)
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


__all__ = [
    "MoriAdapters",
    "NixlAdapters",
    "WorkerRuntime",
    "ZmqAdapters",
    "build_worker",
    "transport_adapters",
]
