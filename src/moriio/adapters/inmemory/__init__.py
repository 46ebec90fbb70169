"""In-memory fakes of the ports: they record what happened and copy real bytes."""

from moriio.adapters.inmemory.channel import (
    FaultPlan,
    InMemoryControlChannel,
    InMemoryNetwork,
    Sent,
)
from moriio.adapters.inmemory.clock import FakeClock
from moriio.adapters.inmemory.engine import InMemoryFabric, InMemoryTransferEngine, PostRecord

__all__ = [
    "FakeClock",
    "FaultPlan",
    "InMemoryControlChannel",
    "InMemoryFabric",
    "InMemoryNetwork",
    "InMemoryTransferEngine",
    "PostRecord",
    "Sent",
]
