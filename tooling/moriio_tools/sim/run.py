"""One deterministic simulation run: a producer and a consumer over a fake clock, with faults.

Everything random comes from the run's seed: the workload, the fault profile, and the
chaos wrappers' own generators. A broken invariant ends the run; the result carries it and
the one-line command that replays the run.
"""

from __future__ import annotations

import math
import random

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.config.settings import ConnectorSettings
from moriio.container import SchedulerContainer, SchedulerRole
from moriio.domain.params.transfer_params import PeerEndpoint, TransferParams, parse_transfer_params
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, build_stack
from moriio_tools.sim.aborts import Aborts
from moriio_tools.sim.checks import check_pending_buffers
from moriio_tools.sim.config import (
    RunResult,
    ServiceWrapper,
    SimConfig,
    Worker,
    describe_crash,
    generate,
    quiet_logs,
    run_key,
)
from moriio_tools.sim.fences import Owner, fence_check
from moriio_tools.sim.invariants import BlockPool, InvariantViolationError, Violation, violated
from moriio_tools.sim.node_faults import NodeFaults
from moriio_tools.sim.nodes import ConsumerNode, ProducerNode
from moriio_tools.sim.requests import (
    ConsumerRequest,
    NodeEnv,
    Outcome,
    ProducerRequest,
    PState,
)
from moriio_tools.sim.workload import AbortPoint, RequestPlan, Workload
from moriio_tools.sim.wrapup import Wrapup

EARLY_RELEASE = "release_before_mapping"
"""Fault kind: a release reached the producer's worker before the transfer's hold or save."""

PRODUCER = Endpoint(handshake_port=7000, notify_port=7100)
CONSUMER = Endpoint(handshake_port=8000, notify_port=8100)


class Simulation(Aborts, NodeFaults, Wrapup):
    """A producer node and a consumer node on one fabric, network and fake clock."""

    def __init__(
        self,
        seed: int,
        requests: int,
        mode: TransferMode,
        *,
        config: SimConfig | None = None,
        wrap_service: ServiceWrapper | None = None,
        workload: Workload | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.mode = mode
        self.result = RunResult(seed, mode, requests)
        self._rng = random.Random(run_key(seed, mode, requests))
        generated = generate(seed, self._rng, requests, mode, self.config)
        self.workload = workload or generated  # a given workload still keeps the stack seeds
        cfg = self.config
        self._wrap = wrap_service
        self.clock = FakeClock(record_sleeps=False)
        self.clock.on_sleep = self._interleave
        self._stepping: set[str] = set()
        self._last_step = {"producer": -math.inf, "consumer": -math.inf}
        self._tick_no = 0
        self.fabric = InMemoryFabric()
        self.network = InMemoryNetwork(self.clock)
        shape = self.workload.shape
        self.env = NodeEnv(
            mode,
            cfg.timing,
            cfg.num_layers,
            cfg.block_size,
            token_budget=shape.token_budget,
            chunk_tokens=shape.chunk_tokens,
        )
        self._quiet = False
        self._clean_start: int | None = None
        self.stacks: list[Stack] = []
        self._incarnation = {"producer": 0, "consumer": 0}
        self._down_until: dict[str, int] = {}
        self.producer: ProducerNode | None = self._new_producer()
        self.consumer: ConsumerNode | None = self._new_consumer()
        self._accepting = True
        self._pending = list(self.workload.requests)
        self._pending.reverse()
        self._p_requests: dict[int, ProducerRequest] = {}  # on the live producer
        self._submitted: set[int] = set()
        self._d_requests: dict[int, ConsumerRequest] = {}
        self._outcomes: dict[int, Outcome] = {}
        self._abort_watch: dict[int, RequestPlan] = {}
        self._graveyard: list[KVMemory] = []

    # -- construction -----------------------------------------------------------------------

    def _stack(self, role: str, endpoint: Endpoint, memory: KVMemory) -> Stack:
        profile = self.workload.faults
        # A restarted process is a new engine: its regions are new (an in-memory engine that
        # reused the name would let stale descriptors reach the new process's memory).
        name = f"{role}#{self._incarnation[role]}"
        stack = build_stack(
            name=name,
            mode=self.mode,
            is_producer=role == "producer",
            endpoint=endpoint,
            memory=memory,
            clock=self.clock,
            fabric=self.fabric,
            network=self.network,
            timing=self.config.timing,
            rng=self._rng,
            engine_plan=EngineFaultPlan() if self._quiet else profile.engine,
            channel_plan=ChannelFaultPlan() if self._quiet else profile.channel,
            wall_offset=self._wall_offset(name),
        )
        stack.engine.on_land = fence_check(name, self._owner)
        self.stacks.append(stack)
        return stack

    def _owner(self, engine: str) -> Owner | None:
        for role, node in (("producer", self.producer), ("consumer", self.consumer)):
            if node is not None and node.stack.name == engine:
                return role, node.memory, node.pool
        return None

    def _wall_offset(self, name: str) -> float:
        """This host's wall-clock skew: within half the allowance either way (its own stream,
        so the workload and the fault draws stay the same)."""
        half = self.config.timing.clock_skew_allowance / 2 * self.workload.faults.skew
        rng = random.Random(f"{run_key(self.result.seed, self.mode, self.result.requests)}/{name}")
        offset = rng.uniform(-half, half)
        if offset:
            self.result.faults["clock_skew"] += 1
        return offset

    def _worker(self, role: str, stack: Stack) -> Worker:
        return stack.service if self._wrap is None else self._wrap(role, stack.service)

    def _scheduler(
        self, role: SchedulerRole, endpoint: LocalEndpoint | None = None
    ) -> SchedulerContainer:
        """A node's scheduler half, composed as an engine's, on the simulation's timing."""
        parts = SchedulerContainer(
            settings=ConnectorSettings(mode=self.mode),
            role=role,
            block_size=self.config.block_size,
            policy=self.config.timing.policy,
        )
        if endpoint is not None:
            parts.endpoint.override(endpoint)
        return parts

    def _new_producer(self) -> ProducerNode:
        cfg = self.config
        blocks = self.workload.shape.producer_blocks
        memory = KVMemory(cfg.num_layers, blocks, cfg.block_size)
        stack = self._stack("producer", PRODUCER, memory)
        endpoint = LocalEndpoint(
            engine_id="producer",
            host=HOST,
            handshake_port=PRODUCER.handshake_port,
            notify_port=PRODUCER.notify_port,
            tp_size=1,
            dp_size=1,
            dp_rank=0,
            instance_id=stack.name,
        )
        book = self._scheduler(
            SchedulerRole(is_producer=True, is_consumer=False), endpoint
        ).producer_book()
        if book.handoff_key is not None:  # as the scheduler's first step carries it
            stack.service.set_handoff_key(book.handoff_key)
            stack.handoff_key = book.handoff_key
        pool = BlockPool("producer", blocks)
        return ProducerNode(self.env, stack, self._worker("producer", stack), memory, book, pool)

    def _new_consumer(self) -> ConsumerNode:
        cfg = self.config
        blocks = self.workload.shape.consumer_blocks
        memory = KVMemory(cfg.num_layers, blocks, cfg.block_size)
        stack = self._stack("consumer", CONSUMER, memory)
        book = self._scheduler(SchedulerRole(is_producer=False, is_consumer=True)).consumer_book()
        pool = BlockPool("consumer", blocks)
        return ConsumerNode(self.env, stack, self._worker("consumer", stack), memory, book, pool)

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Run to completion; never raises for a broken invariant (see ``result.violation``)."""
        result = self.result
        try:
            with quiet_logs():
                self._run()
        except InvariantViolationError as exc:
            result.violation = exc
        except Exception as exc:
            result.violation = violated(Violation.CRASH, describe_crash(exc))
        finally:
            self._count_faults()
        return result

    def _run(self) -> None:
        tick = 0
        cfg = self.config
        while True:
            self.result.ticks = tick
            self._tick(tick)
            if not self._pending and not self._busy():
                break
            tick += 1
            if tick > self.workload.last_arrival + cfg.max_idle_ticks:
                raise violated(Violation.PAST_DEADLINE, f"still busy after {tick} ticks")
            self.clock.advance(cfg.timing.tick)
        self.result.ticks = tick
        self._drain(tick)
        self._final_checks()

    def _busy(self) -> bool:
        return any(
            node is not None and node.has_requests() for node in (self.producer, self.consumer)
        ) or bool(self._down_until)

    def _tick(self, tick: int) -> None:
        now = self.clock.now()
        self._node_faults(tick)
        if tick == self.workload.quiet_tick:
            self._silence()
        while self._pending and self._due(self._pending[-1], tick):
            self._submit(self._pending.pop(), tick)
        self._aborts(tick, now)
        self._land_due()
        self._tick_no = tick
        stepped = self._step_producer(tick) | self._step_consumer(tick)
        if stepped:
            self._collect_outcomes()
            check_pending_buffers(self.producer, self.consumer)

    def _step_producer(self, tick: int, *, idle: bool = False) -> bool:
        """One producer engine step, if it has work (or ``idle``); True when it stepped."""
        producer = self.producer
        if producer is None or not (idle or producer.has_requests()):
            return False
        self._stepping.add("producer")
        try:
            now = self._last_step["producer"] = self.clock.now()
            for request, params in producer.step(tick, now):
                self._forward(request, params)
        finally:
            self._stepping.discard("producer")
        return True

    def _step_consumer(self, tick: int, *, idle: bool = False) -> bool:
        """One consumer engine step, if it has work (or ``idle``); True when it stepped."""
        consumer = self.consumer
        if consumer is None or not (idle or consumer.has_requests()):
            return False
        self._stepping.add("consumer")
        try:
            now = self._last_step["consumer"] = self.clock.now()
            consumer.step(tick, now)
            self._count_early_releases(consumer, tick)
        finally:
            self._stepping.discard("consumer")
        return True

    def _interleave(self) -> None:
        """A worker blocked (the clock slept): the other engine, a separate process, runs
        its next step if that is due."""
        self._land_due()
        due = self.clock.now() - self.config.timing.tick
        if "producer" not in self._stepping and self._last_step["producer"] <= due:
            self._step_producer(self._tick_no)
        if "consumer" not in self._stepping and self._last_step["consumer"] <= due:
            self._step_consumer(self._tick_no)

    def _land_due(self) -> None:
        """DMAs land whether or not their owner polls: late batches whose time came."""
        for node in (self.producer, self.consumer):
            if node is not None:
                node.stack.engine.land_due()

    def _due(self, plan: RequestPlan, tick: int) -> bool:
        """Clean requests wait until the faults stopped, the settle time passed, and both
        nodes drained their backlog (overload is not what they test)."""
        if not plan.clean:
            return plan.arrival_tick <= tick
        if self._clean_start is None:
            quiet = self.workload.quiet_tick
            if quiet is None or tick < quiet + self.config.settle_ticks or self._busy():
                return False
            self._clean_start = tick
        return plan.arrival_tick <= tick - self._clean_start

    # -- requests ---------------------------------------------------------------------------

    def _submit(self, plan: RequestPlan, tick: int) -> None:
        if not self._accepting:
            return
        producer, consumer = self.producer, self.consumer
        if producer is None or (consumer is None and self.mode is TransferMode.WRITE):
            self._outcomes[plan.uid] = Outcome.NOT_SERVED  # the proxy cannot reach them
            return
        tid = f"tx-{self.result.seed}-{plan.uid}"
        p_peer = None
        if self.mode is TransferMode.WRITE:
            p_peer = PeerEndpoint(HOST, CONSUMER.handshake_port, CONSUMER.notify_port, 1)
        p_params = TransferParams(tid, False, True, None, p_peer)
        p_request = ProducerRequest(plan, f"p-{plan.uid}", p_params, since_tick=tick)
        self._p_requests[plan.uid] = p_request
        self._submitted.add(plan.uid)
        producer.add(p_request)
        if plan.abort is not None:
            self._abort_watch[plan.uid] = plan
        if consumer is not None and self.mode is TransferMode.WRITE:
            peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
            d_params = TransferParams(tid, True, False, None, peer)
            d_request = ConsumerRequest(plan, f"d-{plan.uid}", d_params, since_tick=tick)
            self._d_requests[plan.uid] = d_request
            consumer.add(d_request)

    def _forward(self, request: ProducerRequest, raw: dict[str, object]) -> None:
        """READ: the proxy sends the finished prefill's params on to the consumer."""
        if self.mode is not TransferMode.READ:
            return
        plan = request.plan
        if plan.abort is AbortPoint.CLIENT_BEFORE_DECODE:
            self._outcomes[plan.uid] = Outcome.ABORTED
            self.result.faults[plan.abort] += 1
            self._abort_watch.pop(plan.uid, None)
            return
        consumer = self.consumer
        if consumer is None:
            self._outcomes[plan.uid] = Outcome.LOST
            return
        rid = f"d-{plan.uid}"
        params = parse_transfer_params(raw, rid)
        if params is None:
            raise violated(Violation.UNEXPECTED_REPORT, f"producer returned no params for {rid}")
        d_request = ConsumerRequest(plan, rid, params, since_tick=request.since_tick)
        self._d_requests[plan.uid] = d_request
        consumer.add(d_request)

    def _count_early_releases(self, consumer: ConsumerNode, tick: int) -> None:
        """Count releases the consumer sent before the producer's worker knew the transfer."""
        orders = consumer.last_orders
        for tid in [o.transfer_id for o in orders.releases + orders.abort_writes]:
            request = self._p_requests.get(int(tid.rsplit("-", 1)[1]))
            if request is None:
                continue
            early = (
                request.state is PState.HELD and request.since_tick == tick
                if self.mode is TransferMode.READ
                else request.state is not PState.HELD
            )
            if early:
                self.result.faults[EARLY_RELEASE] += 1

    def _collect_outcomes(self) -> None:
        consumer = self.consumer
        if consumer is None:
            return
        for request in consumer.take_finished():
            if request.outcome is None:
                raise violated(Violation.NO_OUTCOME, f"{request.rid} ended without an outcome")
            self._outcomes.setdefault(request.plan.uid, request.outcome)

    def _silence(self) -> None:
        """The faults stop: quiet plans on every live stack (and on any restarted one)."""
        self._quiet = True
        for node in (self.producer, self.consumer):
            if node is not None:
                node.stack.engine.plan = EngineFaultPlan()
                node.stack.channel.plan = ChannelFaultPlan()


def run_one(
    seed: int, requests: int, mode: TransferMode, config: SimConfig | None = None
) -> RunResult:
    """Run one seeded simulation."""
    return Simulation(seed, requests, mode, config=config).run()
