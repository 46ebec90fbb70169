"""Chaos mode: wrappers that inject seeded faults into any TransferEngine or ControlChannel.

Opt-in (``chaos_seed`` in the connector settings) and used by the deterministic simulation
(in the tooling, ``moriio_tools.sim``). The wrappers speak only the ports, so they fit every
adapter.
"""

from moriio.adapters.chaos.channel import ChaosControlChannel
from moriio.adapters.chaos.engine import ChaosTransferEngine
from moriio.adapters.chaos.mode import ChaosMode
from moriio.adapters.chaos.plans import (
    ChannelFault,
    ChannelFaultPlan,
    EngineFault,
    EngineFaultPlan,
)

__all__ = [
    "ChannelFault",
    "ChannelFaultPlan",
    "ChaosControlChannel",
    "ChaosMode",
    "ChaosTransferEngine",
    "EngineFault",
    "EngineFaultPlan",
]
