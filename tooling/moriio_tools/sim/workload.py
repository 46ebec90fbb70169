"""Seeded workload of one run: requests, their abort points, and the run's fault profile."""

from __future__ import annotations

import dataclasses
import enum
import random
from dataclasses import dataclass

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.values.modes import TransferMode


class AbortPoint(enum.StrEnum):
    """Where in its lifecycle a request is aborted (counted as a fault kind)."""

    PRODUCER_WAITING = "abort_producer_waiting"  # queued on the producer, no blocks yet
    PRODUCER_PREFILL = "abort_producer_prefill"  # mid chunked prefill
    CLIENT_BEFORE_DECODE = "abort_before_decode"  # READ: never forwarded to the consumer
    CONSUMER_WAITING = "abort_consumer_waiting"  # queued on the consumer, no blocks yet
    CONSUMER_AWAITING = "abort_consumer_awaiting"  # WRITE: waiting for the producer's writes
    CONSUMER_DECODING = "abort_consumer_decoding"  # after its load, while decoding


READ_POINTS = (
    AbortPoint.PRODUCER_WAITING,
    AbortPoint.PRODUCER_PREFILL,
    AbortPoint.CLIENT_BEFORE_DECODE,
    AbortPoint.CONSUMER_WAITING,
    AbortPoint.CONSUMER_DECODING,
)
WRITE_POINTS = (
    AbortPoint.PRODUCER_WAITING,
    AbortPoint.PRODUCER_PREFILL,
    AbortPoint.CONSUMER_WAITING,
    AbortPoint.CONSUMER_AWAITING,
    AbortPoint.CONSUMER_DECODING,
)


CLEAN_SPACING = 8  # ticks between clean requests: no queue forms, so each one must load


class NodeFault(enum.StrEnum):
    PRODUCER_RESTART = "producer_restart"
    PRODUCER_VANISH = "producer_vanish"
    CONSUMER_RESTART = "consumer_restart"
    CONSUMER_VANISH = "consumer_vanish"


@dataclass(frozen=True, slots=True)
class RequestPlan:
    uid: int
    arrival_tick: int
    tokens: int
    decode_steps: int
    hit_tokens: int  # the consumer's local prefix-cache hit (whole blocks)
    abort: AbortPoint | None
    abort_after: int  # ticks spent in the abort state before the abort
    clean: bool = False  # arrives after the faults stopped: it must load


@dataclass(frozen=True, slots=True)
class RunShape:
    """Sizes of one run's engines (small pools make blocks reused, and queues form)."""

    producer_blocks: int
    consumer_blocks: int
    token_budget: int
    chunk_tokens: int


@dataclass(frozen=True, slots=True)
class FaultProfile:
    engine: EngineFaultPlan
    channel: ChannelFaultPlan
    node_fault: NodeFault | None
    node_fault_tick: int
    restart_after: int  # ticks a restarting producer stays down
    # How far the hosts' wall clocks disagree, as a fraction of the skew allowance (each is
    # off by at most half of it times this).
    skew: float = 1.0
    # NIC faults that retire every connection of a node (mori 1.2.4's fatal async events):
    # (tick, "producer" or "consumer"), before the faults stop.
    retirements: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Workload:
    requests: tuple[RequestPlan, ...]
    faults: FaultProfile
    shape: RunShape
    last_arrival: int
    quiet_tick: int | None  # from this tick on nothing is injected (None: never quiet)


def make_workload(
    rng: random.Random,
    mode: TransferMode,
    count: int,
    block_size: int,
    max_blocks: int,
    settle_ticks: int,
    fence_rng: random.Random | None = None,
    retire_rng: random.Random | None = None,
) -> Workload:
    """Requests arriving over ticks, with abort points and one fault profile per run.

    The last tenth of the requests are clean: no aborts, and their arrival ticks count from
    when the faults stopped, ``settle_ticks`` passed and the backlog drained (the run decides
    that), so they show whether the pair recovered.
    """
    abort_rate = rng.choice((0.0, 0.05, 0.15, 0.3))
    points = READ_POINTS if mode is TransferMode.READ else WRITE_POINTS
    shape = RunShape(
        producer_blocks=rng.choice((2, 4, 8)) * max_blocks,
        consumer_blocks=rng.choice((2, 4, 8)) * (max_blocks + 1),
        token_budget=rng.choice((2, 8, 32)) * block_size,
        chunk_tokens=rng.choice((1, 2, 4)) * block_size,
    )
    clean_from = count - count // 10
    plans = []
    tick = 0
    quiet_tick = None
    for uid in range(count):
        clean = uid >= clean_from
        if clean and quiet_tick is None:
            quiet_tick, tick = tick + 1, 0
        tick += rng.choice((0, 0, 1, 1, 2)) if not clean else CLEAN_SPACING
        tokens = rng.randint(1, max_blocks * block_size)
        hit = 0
        if rng.random() < 0.2:
            hit = rng.randint(0, (tokens - 1) // block_size) * block_size
        abort = rng.choice(points) if rng.random() < abort_rate and not clean else None
        plans.append(
            RequestPlan(
                uid=uid,
                arrival_tick=tick,
                tokens=tokens,
                decode_steps=rng.randint(1, 4),
                hit_tokens=hit,
                abort=abort,
                abort_after=rng.choice((0, 0, 1, 2, 5)),
                clean=clean,
            )
        )
    faulty_until = tick if quiet_tick is None else quiet_tick
    last = faulty_until + (0 if quiet_tick is None else settle_ticks + tick)
    profile = _fault_profile(rng, faulty_until)
    if fence_rng is not None:
        profile = _with_fence_faults(fence_rng, profile)
    if retire_rng is not None:
        profile = dataclasses.replace(profile, retirements=_retirements(retire_rng, faulty_until))
    return Workload(tuple(plans), profile, shape, last, quiet_tick)


def _fault_profile(rng: random.Random, last_arrival: int) -> FaultProfile:
    heavy = rng.random() < 0.3
    scale = 2.0 if heavy else 1.0
    engine = EngineFaultPlan(
        backpressure=rng.uniform(0, 0.05) * scale,
        burst_max=rng.randint(1, 8),
        failed=rng.uniform(0, 0.02) * scale,
        failed_in_flight=rng.uniform(0, 0.02) * scale,
        hung=rng.uniform(0, 0.01) * scale,
        slow=rng.uniform(0, 0.15) * scale,
        slow_polls=rng.randint(1, 40),
    )
    channel = ChannelFaultPlan(
        drop=rng.uniform(0, 0.02) * scale,
        duplicate=rng.uniform(0, 0.04) * scale,
        reorder=rng.uniform(0, 0.05) * scale,
        delay=rng.uniform(0, 0.04) * scale,
        delay_max=rng.choice((0.02, 0.1, 0.3)),
        request_drop=rng.uniform(0, 0.1) * scale,
        request_delay=rng.uniform(0, 0.1) * scale,
    )
    roll = rng.random()
    node_fault = None
    for fault, p in (
        (NodeFault.PRODUCER_RESTART, 0.12),
        (NodeFault.CONSUMER_RESTART, 0.08),
        (NodeFault.PRODUCER_VANISH, 0.03),
        (NodeFault.CONSUMER_VANISH, 0.03),
    ):
        if roll < p:
            node_fault = fault
            break
        roll -= p
    return FaultProfile(
        engine=engine,
        channel=channel,
        node_fault=node_fault,
        node_fault_tick=rng.randint(1, max(1, last_arrival)),
        restart_after=rng.randint(0, 30),
    )


def _with_fence_faults(rng: random.Random, profile: FaultProfile) -> FaultProfile:
    """Late completions, lost cancels, statuses stuck after a teardown, and how far the
    clocks disagree: drawn from their own stream, so the rest of a seed's run is unchanged."""
    heavy = rng.random() < 0.3
    engine = dataclasses.replace(
        profile.engine,
        # Landing up to late_max (s) after the post: before the 0.05 s timeout, during the
        # quarantine after it, or past the quarantine (the teardown must stop it).
        late=rng.uniform(0, 0.02) * (2.0 if heavy else 1.0),
        late_max=rng.choice((0.03, 0.08, 0.2)),
        lost_cancel=rng.choice((0.0, 0.5, 1.0)),
        stuck_after_remove=rng.choice((0.0, 0.5, 1.0)),
    )
    return dataclasses.replace(profile, engine=engine, skew=rng.choice((0.0, 0.5, 1.0, 1.0)))


def _retirements(rng: random.Random, last_tick: int) -> tuple[tuple[int, str], ...]:
    """NIC faults in a third of the runs (one to three), from their own stream."""
    if rng.random() >= 1 / 3:
        return ()
    count = rng.randint(1, 3)
    return tuple(
        sorted(
            (rng.randint(1, max(1, last_tick)), rng.choice(("producer", "consumer")))
            for _ in range(count)
        )
    )
