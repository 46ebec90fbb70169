"""Chaos mode (``chaos_seed``): one worker's engine and notify channel inject seeded faults."""

from __future__ import annotations

import random

from moriio.adapters.chaos.channel import ChaosControlChannel
from moriio.adapters.chaos.engine import ChaosTransferEngine
from moriio.adapters.chaos.plans import ChannelFaultPlan, EngineFaultPlan
from moriio.ports import Clock, ControlChannel, TransferEngine
from moriio.ports.control_channel import MsgT


class ChaosMode:
    """Wrappers with moderate fault plans; each worker draws from its own seeded streams."""

    def __init__(self, seed: int, engine_name: str) -> None:
        rng = random.Random(f"moriio-chaos/{seed}/{engine_name}")
        self._engine_rng = random.Random(rng.getrandbits(64))
        self._channel_rng = random.Random(rng.getrandbits(64))

    def engine(self, inner: TransferEngine) -> TransferEngine:
        return ChaosTransferEngine(inner, self._engine_rng, EngineFaultPlan.moderate())

    def channel(self, inner: ControlChannel[MsgT], clock: Clock) -> ControlChannel[MsgT]:
        return ChaosControlChannel(inner, self._channel_rng, ChannelFaultPlan.moderate(), clock)
