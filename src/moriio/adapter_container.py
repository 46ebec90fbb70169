"""The slots every adapter container fills: the one shape :func:`moriio.container.build_worker`
opens, whether the adapters are the production ones (ZMQ plus NIXL or mori) or fakes.

A container subclasses :class:`AdapterContainer` and declares the providers it fills; tests
and the vLLM plugin override single providers (an in-memory engine, device fences) instead
of wiring a worker their own way.
"""

from __future__ import annotations

from collections.abc import Callable

from dependency_injector import containers, providers

from moriio.bootstrap import WorkerIdentity, WorkerPorts
from moriio.config.settings import ConnectorSettings
from moriio.domain.protocol.messages import Message
from moriio.domain.worker.producer.write_fences import HostFences
from moriio.ports import Clock, ControlChannel, FenceSource, LayerGates, TransferEngine

EngineWrapper = Callable[[TransferEngine], TransferEngine]


class AdapterContainer(containers.DeclarativeContainer):
    """What one worker runs on. ``engine``, ``notify_channel`` and ``handshake_channel`` are
    filled by each container; the rest default to host memory and background handshakes."""

    settings = providers.Dependency(instance_of=ConnectorSettings)
    identity = providers.Dependency(instance_of=WorkerIdentity)
    secret: providers.Dependency[bytes | None] = providers.Dependency()
    engine: providers.Provider[TransferEngine] = providers.Dependency()
    notify_channel: providers.Provider[ControlChannel[Message]] = providers.Dependency()
    handshake_channel: providers.Provider[ControlChannel[Message]] = providers.Dependency()
    clock: providers.Provider[Clock] = providers.Dependency()
    wall_clock: providers.Provider[Clock | None] = providers.Object(None)  # None: ``clock``
    background_handshakes: providers.Provider[bool] = providers.Object(True)
    # The KV's device: fences on its streams, and the call binding a thread to it (None:
    # host memory). The vLLM plugin overrides both for device KV caches.
    fences: providers.Provider[FenceSource] = providers.Singleton(HostFences)
    bind_device: providers.Provider[Callable[[], None] | None] = providers.Object(None)
    layer_gates: providers.Provider[LayerGates | None] = providers.Object(None)
    # Wraps the transport's engine (the vLLM plugin: same-host device copies); None: as is.
    engine_wrapper: providers.Provider[EngineWrapper | None] = providers.Object(None)


def open_ports(
    adapters: AdapterContainer,
    wrap_first: EngineWrapper | None = None,
) -> WorkerPorts:
    """The opened adapters as a worker's ports. ``wrap_first`` wraps the raw engine before
    the container's ``engine_wrapper`` does (chaos mode: faults at the transport's edge)."""
    engine = adapters.engine()
    if wrap_first is not None:
        engine = wrap_first(engine)
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
