"""One worker on in-memory ports behind chaos wrappers, wired by :func:`moriio.bootstrap`.

The simulation and the domain's tests build their workers here: the same composition as a
production worker, on a shared in-memory fabric and network and a fake clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from moriio.adapters.chaos import (
    ChannelFaultPlan,
    ChaosControlChannel,
    ChaosTransferEngine,
    EngineFaultPlan,
)
from moriio.bootstrap import HandshakeTiming, WorkerIdentity, WorkerPorts, bootstrap
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.messages import Message
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.kv_registry import LocalKV
from moriio.domain.worker.service import WorkerService
from moriio.ports import Clock, TransferEngine
from moriio.testing.handoffs import TEST_HANDOFF_KEY
from moriio.testing.inmemory import (
    InMemoryControlChannel,
    InMemoryFabric,
    InMemoryNetwork,
    InMemoryTransferEngine,
)
from moriio.testing.stacks.memory import HEADS, KVMemory

HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Timing:
    """Fake-clock seconds of one simulation (small, so deadlines pass in a few ticks)."""

    tick: float = 0.005
    poll_interval: float = 0.001
    transfer_timeout: float = 0.05
    defer_timeout: float = 0.1
    handshake_timeout: float = 0.02
    handshake_retry_after: float = 0.02
    # The wall clocks of the two hosts disagree by up to this much (each is off by at most
    # half of it); both sides are configured with it as their skew allowance.
    clock_skew_allowance: float = 0.01
    quarantine_timeout: float = 0.05
    liveness_timeout: float = 0.06

    @property
    def write_fence_s(self) -> float:
        """How long a WRITE consumer may keep announced blocks without a verdict."""
        return self.policy.write_fence(0.0)

    @property
    def policy(self) -> TransferPolicy:
        return TransferPolicy(
            transfer_timeout=self.transfer_timeout,
            defer_timeout=self.defer_timeout,
            backoff_initial=self.poll_interval,
            backoff_max=4 * self.poll_interval,
            clock_skew_allowance=self.clock_skew_allowance,
            quarantine_timeout=self.quarantine_timeout,
            liveness_timeout=self.liveness_timeout,
        )


class SkewedClock:
    """A host's wall clock: the simulation's clock, off by a fixed ``offset`` seconds."""

    def __init__(self, clock: Clock, offset: float) -> None:
        self._clock = clock
        self.offset = offset

    def now(self) -> float:
        return self._clock.now() + self.offset

    def sleep(self, seconds: float) -> None:
        self._clock.sleep(seconds)


@dataclass(frozen=True, slots=True)
class Endpoint:
    handshake_port: int
    notify_port: int


@dataclass(slots=True)
class Stack:
    """The adapters and services of one worker incarnation."""

    name: str
    inner_engine: TransferEngine
    engine: ChaosTransferEngine
    inner_channel: InMemoryControlChannel[Message]
    channel: ChaosControlChannel[Message]
    handshake: InMemoryControlChannel[Message]
    kv: LocalKV
    service: WorkerService
    handoff_key: bytes = b""  # a READ producer's, as its scheduler hands it to the workers

    def crash(self) -> None:
        """Lose everything at once, as a killed process does."""
        self.channel.close()
        self.handshake.close()
        self.engine.close()


def fingerprint(mode: TransferMode, memory: KVMemory) -> Fingerprint:
    return Fingerprint(
        model_name="sim-model",
        dtype="int32",
        block_size=memory.block_size,
        layout_kinds=("separated",) * memory.num_layers,
        tp_size=1,
        transfer_mode=mode,
        total_num_kv_heads=HEADS,
        is_mla=False,
    )


def build_stack(
    *,
    name: str,
    mode: TransferMode,
    is_producer: bool,
    endpoint: Endpoint,
    memory: KVMemory,
    clock: Clock,
    fabric: InMemoryFabric,
    network: InMemoryNetwork,
    timing: Timing,
    rng: random.Random,
    engine_plan: EngineFaultPlan,
    channel_plan: ChannelFaultPlan,
    wall_offset: float = 0.0,
    inner: TransferEngine | None = None,
    handoff_key: bytes | None = TEST_HANDOFF_KEY,
) -> Stack:
    """Wire one worker; ``name`` must be unique on ``fabric`` (one per incarnation).

    ``name`` is also the worker's instance id: a restarted engine is a new instance.
    ``wall_offset``: how far this host's wall clock is ahead of the simulation's clock.
    ``inner``: the engine under the chaos wrapper (default: an in-memory one on ``fabric``).
    ``handoff_key``: a READ producer's signing key, as its scheduler's book gives it
    (None: not given yet, as before the scheduler's first step).
    """
    seed = rng.randrange(1 << 30)
    inner_engine = inner or _aborting_engine(name, fabric, seed)
    engine = ChaosTransferEngine(
        inner_engine, random.Random(rng.randrange(1 << 62)), engine_plan, clock
    )
    inner_channel: InMemoryControlChannel[Message] = InMemoryControlChannel(
        network, WIRE_CODEC, HOST, endpoint.notify_port
    )
    channel = ChaosControlChannel(
        inner_channel, random.Random(rng.randrange(1 << 62)), channel_plan, clock
    )
    handshake: InMemoryControlChannel[Message] = InMemoryControlChannel(
        network, WIRE_CODEC, HOST, endpoint.handshake_port
    )
    identity = WorkerIdentity(
        engine_name=name,
        host=HOST,
        bind_host=HOST,
        handshake_port=endpoint.handshake_port,
        notify_port=endpoint.notify_port,
        tp_rank=0,
        tp_size=1,
        dp_rank=0,
        is_producer=is_producer,
        is_consumer=not is_producer,
        fingerprint=fingerprint(mode, memory),
        instance_id=name,
    )
    ports = WorkerPorts(
        engine=engine,
        notify=channel,
        handshake=handshake,
        clock=clock,
        wall_clock=SkewedClock(clock, wall_offset),
        background_handshakes=False,
    )
    worker = bootstrap(
        ports,
        identity,
        memory.tensors(),
        mode=mode,
        policy=timing.policy,
        handshakes=HandshakeTiming(timing.handshake_timeout, timing.handshake_retry_after),
        poll_interval=timing.poll_interval,
    )
    key = b""
    if mode is TransferMode.READ and is_producer and handoff_key:
        key = handoff_key
        worker.service.set_handoff_key(key)
    return Stack(
        name,
        inner_engine,
        engine,
        inner_channel,
        channel,
        handshake,
        worker.kv,
        worker.service,
        key,
    )


def _aborting_engine(name: str, fabric: InMemoryFabric, seed: int) -> InMemoryTransferEngine:
    """An in-memory transport whose cancel stops a batch: the chaos plan's ``lost_cancel``
    decides when a cancel is lost."""
    engine = InMemoryTransferEngine(name, fabric, seed=seed)
    engine.cancels_stop_batches = True
    return engine
