"""Chaos mode for a wired worker, loaded by ``moriio.container`` only when ``chaos_seed`` is set."""

from __future__ import annotations

import random
from typing import Any

from dependency_injector import providers

from moriio.domain.protocol.messages import Message
from moriio.testing.chaos.channel import ChaosControlChannel
from moriio.testing.chaos.engine import ChaosTransferEngine
from moriio.testing.chaos.plans import ChannelFaultPlan, EngineFaultPlan


def enable_chaos(adapters: Any, seed: int, engine_name: str) -> None:
    """The worker's engine and notify channel inject seeded faults.

    The wrappers override the adapter container's providers; the wrapped resources are still
    the ones ``shutdown_resources()`` closes. Each worker draws from its own seeded stream.
    """
    rng = random.Random(f"moriio-chaos/{seed}/{engine_name}")
    engine = ChaosTransferEngine(
        adapters.engine(), random.Random(rng.getrandbits(64)), EngineFaultPlan.moderate()
    )
    channel: ChaosControlChannel[Message] = ChaosControlChannel(
        adapters.notify_channel(),
        random.Random(rng.getrandbits(64)),
        ChannelFaultPlan.moderate(),
        adapters.clock(),
    )
    adapters.engine.override(providers.Object(engine))
    adapters.notify_channel.override(providers.Object(channel))


__all__ = ["enable_chaos"]
