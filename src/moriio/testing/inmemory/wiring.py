"""In-memory adapter container: pass it to ``moriio.container.build_worker(adapters=...)``.

Every worker built with it shares one fabric (the "RDMA" side) and one network (the control
channels), so a whole P/D cluster runs in one process with real byte copies.
"""

from __future__ import annotations

from collections.abc import Callable

from dependency_injector import containers, providers

from moriio.config.settings import ConnectorSettings
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.worker.producer.write_fences import HostFences
from moriio.ports import Clock, FenceSource, LayerGates, TransferEngine
from moriio.testing.inmemory.channel import InMemoryControlChannel, InMemoryNetwork
from moriio.testing.inmemory.engine import InMemoryTransferEngine
from moriio.testing.inmemory.fabric import InMemoryFabric


class InMemoryAdapters(containers.DeclarativeContainer):
    """Fakes for tests and simulation: one fabric and network shared by every worker.

    ``identity`` is a ``moriio.container.WorkerIdentity``.
    """

    settings = providers.Dependency(instance_of=ConnectorSettings)
    identity: providers.Dependency[object] = providers.Dependency()
    secret: providers.Dependency[bytes | None] = providers.Dependency()
    fabric = providers.Dependency(instance_of=InMemoryFabric)
    network = providers.Dependency(instance_of=InMemoryNetwork)
    clock: providers.Dependency[Clock] = providers.Dependency()
    wall_clock: providers.Provider[Clock | None] = providers.Object(None)  # the fake clock
    # Inline: a fake clock only advances when told, so handshakes run where they are begun.
    background_handshakes: providers.Provider[bool] = providers.Object(False)
    fences: providers.Provider[FenceSource] = providers.Singleton(HostFences)  # host memory
    bind_device: providers.Provider[Callable[[], None] | None] = providers.Object(None)
    layer_gates: providers.Provider[LayerGates | None] = providers.Object(None)
    engine_wrapper: providers.Provider[Callable[[TransferEngine], TransferEngine] | None] = (
        providers.Object(None)
    )
    engine = providers.Singleton(InMemoryTransferEngine, identity.provided.engine_name, fabric)
    notify_channel = providers.Singleton(
        InMemoryControlChannel,
        network,
        providers.Object(WIRE_CODEC),
        identity.provided.host,
        identity.provided.notify_port,
        trusted_hosts=settings.provided.trusted_remote_hosts,
    )
    handshake_channel = providers.Singleton(
        InMemoryControlChannel,
        network,
        providers.Object(WIRE_CODEC),
        identity.provided.host,
        identity.provided.handshake_port,
        trusted_hosts=settings.provided.trusted_remote_hosts,
    )


__all__ = ["InMemoryAdapters"]
