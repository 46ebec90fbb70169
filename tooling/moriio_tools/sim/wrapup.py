"""The end of a run: drain the workers, then the checks that need the whole run."""

from __future__ import annotations

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio_tools.sim.checks import check_node_at_rest, recovery_finding
from moriio_tools.sim.invariants import Violation, violated
from moriio_tools.sim.state import SimState


class Wrapup(SimState):
    """Drain, final checks and fault counts (a part of ``Simulation``)."""

    def _drain(self, tick: int) -> None:
        """Traffic stopped: step the live workers until their state drains (bounded)."""
        t = self.config.timing
        budget = (
            2 * (t.defer_timeout + t.transfer_timeout + t.quarantine_timeout)
            + self.workload.faults.channel.delay_max
        )
        limit = tick + int(budget / t.tick) + 10
        quiet_engine, quiet_channel = EngineFaultPlan(), ChannelFaultPlan()
        nodes = [n for n in (self.producer, self.consumer) if n is not None]
        for node in nodes:
            node.stack.engine.plan = quiet_engine
            node.stack.channel.plan = quiet_channel
        while True:
            live = {
                n.stack.name: n.stack.service.num_live + n.stack.service.ctx.poster.num_inflight
                for n in nodes
            }
            if not any(live.values()):
                return
            if tick > limit:
                raise violated(
                    Violation.WORKER_LEAK,
                    f"worker state never drained after the traffic stopped: {live}",
                )
            tick += 1
            self.clock.advance(t.tick)
            self._land_due()
            self._step_producer(tick, idle=True)
            self._step_consumer(tick, idle=True)

    def _final_checks(self) -> None:
        for node in (self.producer, self.consumer):
            if node is not None:
                check_node_at_rest(node)
        self._collect_outcomes()
        submitted = {p.uid for p in self.workload.requests if p.uid in self._submitted}
        missing = sorted(submitted - set(self._outcomes))
        if missing:
            raise violated(
                Violation.NO_OUTCOME, f"{len(missing)} request(s) never ended: uids {missing[:8]}"
            )
        self.result.outcomes.update(str(o) for o in self._outcomes.values())
        finding = recovery_finding(self.workload, self._outcomes)
        if finding is not None and self.config.recovery_is_invariant:
            raise finding
        self.result.finding = finding

    def _count_faults(self) -> None:
        faults = self.result.faults
        for stack in self.stacks:
            faults.update(stack.engine.injected)
            faults.update(stack.channel.injected)
