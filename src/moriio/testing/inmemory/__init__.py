"""In-memory fakes of the ports: they record what happened and copy real bytes."""

from moriio.testing.inmemory.channel import InMemoryControlChannel, InMemoryNetwork, Sent
from moriio.testing.inmemory.clock import FakeClock
from moriio.testing.inmemory.engine import InMemoryTransferEngine
from moriio.testing.inmemory.fabric import InMemoryFabric, PostRecord

__all__ = [
    "FakeClock",
    "InMemoryControlChannel",
    "InMemoryFabric",
    "InMemoryNetwork",
    "InMemoryTransferEngine",
    "PostRecord",
    "Sent",
]
