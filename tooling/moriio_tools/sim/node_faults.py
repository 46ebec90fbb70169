"""Node faults: a producer or consumer process restarts (a new instance) or vanishes, or its
NIC retires every connection (in-flight batches fail, their bytes may still land)."""

from __future__ import annotations

import random

from moriio.domain.values.modes import TransferMode
from moriio_tools.sim.aborts import PRODUCER_ABORTS
from moriio_tools.sim.requests import Outcome, PState
from moriio_tools.sim.state import SimState
from moriio_tools.sim.workload import NodeFault


class NodeFaults(SimState):
    """Crashes and restarts at the tick the fault profile says (a part of ``Simulation``)."""

    def _node_faults(self, tick: int) -> None:
        self._retire_connections(tick)
        profile = self.workload.faults
        for role, until in list(self._down_until.items()):
            if tick >= until:
                del self._down_until[role]
                self._incarnation[role] += 1
                if role == "producer":
                    self.producer = self._new_producer()
                else:
                    self.consumer = self._new_consumer()
        fault = profile.node_fault
        if fault is None or tick != profile.node_fault_tick:
            return
        self.result.faults[str(fault)] += 1
        if fault in (NodeFault.CONSUMER_VANISH, NodeFault.CONSUMER_RESTART):
            self._crash_consumer()
        else:
            self._crash_producer()
        if fault is NodeFault.PRODUCER_RESTART:
            self._down_until["producer"] = tick + profile.restart_after
        elif fault is NodeFault.CONSUMER_RESTART:
            self._down_until["consumer"] = tick + profile.restart_after
        else:
            self._accepting = False

    def _crash_producer(self) -> None:
        producer = self.producer
        if producer is None:
            return
        producer.stack.crash()
        for request in producer.all_requests():
            uid = request.plan.uid
            del self._p_requests[uid]  # gone with the process
            if self.mode is TransferMode.READ and request.state is not PState.HELD:
                self._outcomes.setdefault(uid, Outcome.NOT_SERVED)
            if request.plan.abort in PRODUCER_ABORTS or uid in self._outcomes:
                self._abort_watch.pop(uid, None)
        self.producer = None
        self._graveyard.append(producer.memory)  # a dead engine's memory must outlive it

    def _crash_consumer(self) -> None:
        consumer = self.consumer
        if consumer is None:
            return
        consumer.stack.crash()
        self._collect_outcomes()
        for request in consumer.all_requests():
            self._outcomes.setdefault(request.plan.uid, Outcome.LOST)
            self._abort_watch.pop(request.plan.uid, None)
        self.consumer = None
        self._graveyard.append(consumer.memory)

    def _retire_connections(self, tick: int) -> None:
        """The NIC faults due at ``tick``, on the nodes still alive."""
        for at, role in self.workload.faults.retirements:
            node = self.producer if role == "producer" else self.consumer
            if at != tick or node is None:
                continue
            key = f"{self.result.seed}/{self.mode.value}/{tick}/{role}/retire"
            node.stack.engine.retire(random.Random(key))
