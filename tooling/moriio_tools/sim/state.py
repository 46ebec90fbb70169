"""What the parts of a simulation run share: declared here, set by ``Simulation``."""

from __future__ import annotations

from moriio.domain.values.modes import TransferMode
from moriio.testing.inmemory import FakeClock
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import Stack
from moriio_tools.sim.config import RunResult, SimConfig
from moriio_tools.sim.nodes import ConsumerNode, ProducerNode
from moriio_tools.sim.requests import ConsumerRequest, Outcome, ProducerRequest
from moriio_tools.sim.workload import RequestPlan, Workload


class SimState:
    """The state of one run and the steps its parts call (see ``moriio_tools.sim.run``)."""

    config: SimConfig
    mode: TransferMode
    result: RunResult
    workload: Workload
    clock: FakeClock
    stacks: list[Stack]
    producer: ProducerNode | None
    consumer: ConsumerNode | None
    _incarnation: dict[str, int]
    _down_until: dict[str, int]
    _accepting: bool
    _p_requests: dict[int, ProducerRequest]  # on the live producer
    _d_requests: dict[int, ConsumerRequest]
    _submitted: set[int]
    _outcomes: dict[int, Outcome]
    _abort_watch: dict[int, RequestPlan]
    _graveyard: list[KVMemory]

    def _new_producer(self) -> ProducerNode:
        raise NotImplementedError

    def _new_consumer(self) -> ConsumerNode:
        raise NotImplementedError

    def _collect_outcomes(self) -> None:
        raise NotImplementedError

    def _step_producer(self, tick: int, *, idle: bool = False) -> bool:
        raise NotImplementedError

    def _step_consumer(self, tick: int, *, idle: bool = False) -> bool:
        raise NotImplementedError

    def _land_due(self) -> None:
        raise NotImplementedError
