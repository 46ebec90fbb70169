"""In-memory adapter container: pass it to ``moriio.container.build_worker(adapters=...)``.

Every worker built with it shares one fabric (the "RDMA" side) and one network (the control
channels), so a whole P/D cluster runs in one process with real byte copies.
"""

from __future__ import annotations

from dependency_injector import providers

from moriio.adapter_container import AdapterContainer
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.ports import Clock
from moriio.testing.inmemory.channel import InMemoryControlChannel, InMemoryNetwork
from moriio.testing.inmemory.engine import InMemoryTransferEngine
from moriio.testing.inmemory.fabric import InMemoryFabric


class InMemoryAdapters(AdapterContainer):
    """Fakes for tests and simulation: one fabric and network shared by every worker."""

    fabric = providers.Dependency(instance_of=InMemoryFabric)
    network = providers.Dependency(instance_of=InMemoryNetwork)
    clock: providers.Provider[Clock] = providers.Dependency()  # the fake clock, also wall clock
    # Inline: a fake clock only advances when told, so handshakes run where they are begun.
    background_handshakes: providers.Provider[bool] = providers.Object(False)
    engine = providers.Singleton(
        InMemoryTransferEngine, AdapterContainer.identity.provided.engine_name, fabric
    )
    notify_channel = providers.Singleton(
        InMemoryControlChannel,
        network,
        providers.Object(WIRE_CODEC),
        AdapterContainer.identity.provided.host,
        AdapterContainer.identity.provided.notify_port,
        trusted_hosts=AdapterContainer.settings.provided.trusted_remote_hosts,
    )
    handshake_channel = providers.Singleton(
        InMemoryControlChannel,
        network,
        providers.Object(WIRE_CODEC),
        AdapterContainer.identity.provided.host,
        AdapterContainer.identity.provided.handshake_port,
        trusted_hosts=AdapterContainer.settings.provided.trusted_remote_hosts,
    )


__all__ = ["InMemoryAdapters"]
