"""The deterministic fault-injection simulation: thousands of seeded runs, and its checkers.

The first test is the proof: 2,000 seeded runs of 100 requests (READ and WRITE alternating)
with every kind of fault injected hold every invariant. The others show that each invariant
checker catches a deliberately broken worker, and that a failing seed replays exactly.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from moriio.adapters.chaos import (
    ChannelFault,
    ChannelFaultPlan,
    ChaosTransferEngine,
    EngineFault,
    EngineFaultPlan,
)
from moriio.domain.params.orders import StepOrders
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.consumer import read_side
from moriio.domain.worker.peer_checks import ConnectedPeer
from moriio.domain.worker.peers import PeerDirectory
from moriio.domain.worker.poster import Poster
from moriio.domain.worker.producer.write_pushes import WritePusher
from moriio.domain.worker.service import StepReport, WorkerService
from moriio.ports import PeerAddress, TransferHandle
from moriio.testing.stacks.stack import Timing
from moriio_tools.harness import (
    EARLY_RELEASE,
    AbortPoint,
    BlockPool,
    BufferReading,
    InvariantViolationError,
    NodeFault,
    Outcome,
    RunResult,
    SimConfig,
    SimReport,
    Simulation,
    Violation,
    Worker,
    Workload,
    check_all_free,
    check_buffers,
    check_deadline,
    check_listeners,
    check_load_errors,
    run_seeds,
    seeded_workload,
    sim_checks_module,
    sim_main,
)

READ, WRITE = TransferMode.READ, TransferMode.WRITE
CLOCKS_IN_STEP = SimConfig(timing=Timing(clock_skew_allowance=0.0))
# Controls of one mechanism run with liveness probes off: a peer lost to them is given up
# before that mechanism is reached (and the probes change the seeds' fault sequences).
NO_LIVENESS = SimConfig(timing=Timing(liveness_timeout=0.0))
CLOCKS_IN_STEP_NO_LIVENESS = SimConfig(
    timing=Timing(clock_skew_allowance=0.0, liveness_timeout=0.0)
)
EVERY_FAULT = {
    *(str(f) for f in EngineFault),
    *(str(f) for f in ChannelFault),
    *(str(a) for a in AbortPoint),
    *(str(n) for n in NodeFault),
    EARLY_RELEASE,
}


@pytest.mark.timeout(1200)  # about 3 minutes on two quiet cores, far longer on busy ones
def test_two_thousand_seeds_of_100_requests_hold_every_invariant() -> None:
    report = run_seeds(range(2000), 100, "both", workers=2)
    assert report.runs == 2000
    assert report.requests == 200_000
    assert report.runs_by_mode == {"read": 1000, "write": 1000}
    assert report.ok, report.summary()
    missing = sorted(kind for kind in EVERY_FAULT if report.faults[kind] == 0)
    assert not missing, f"fault kinds never injected: {missing}"
    assert report.faults_injected > 50_000
    # No LOCAL_HIT: asynchronous READ loads, like WRITE, always load the prompt's last block.
    for outcome in (Outcome.LOADED, Outcome.LOAD_ERROR, Outcome.ABORTED):
        assert report.outcomes[outcome] > 0, outcome
    # Every request sent after the faults stopped loaded, restarts included.
    assert not report.findings, report.summary()


def test_a_seed_replays_the_same_run() -> None:
    first = Simulation(11, 100, WRITE).run()
    again = Simulation(11, 100, WRITE).run()
    assert first.ticks == again.ticks
    assert first.faults == again.faults
    assert first.outcomes == again.outcomes
    assert first.faults
    assert first.outcomes[Outcome.LOADED] > 0


def test_reports_do_not_depend_on_the_number_of_worker_processes() -> None:
    one, two = run_seeds(range(6), 40, "both"), run_seeds(range(6), 40, "both", workers=2)
    assert (one.runs, one.ticks, one.faults, one.outcomes) == (
        two.runs,
        two.ticks,
        two.faults,
        two.outcomes,
    )


def quiet(seed: int, mode: TransferMode, requests: int = 40, **faults: object) -> Workload:
    """``seed``'s workload without aborts, node faults or injected faults (unless given)."""
    workload = seeded_workload(seed, requests, mode)
    profile = dataclasses.replace(
        workload.faults,
        engine=EngineFaultPlan(),
        channel=ChannelFaultPlan(),
        node_fault=None,
        skew=0.0,
        retirements=(),
    )
    profile = dataclasses.replace(profile, **faults)  # type: ignore[arg-type]
    plans = tuple(dataclasses.replace(p, abort=None) for p in workload.requests)
    return dataclasses.replace(workload, requests=plans, faults=profile)


@pytest.mark.parametrize("mode", [READ, WRITE])
def test_without_faults_every_request_loads_its_producers_bytes(mode: TransferMode) -> None:
    result = Simulation(3, 40, mode, workload=quiet(3, mode)).run()
    assert result.violation is None
    assert result.finding is None
    assert set(result.outcomes) <= {Outcome.LOADED, Outcome.LOCAL_HIT}
    assert result.outcomes[Outcome.LOADED] >= 30
    assert not result.faults


# -- each checker catches a deliberately broken worker -----------------------------------------


class Tampered:
    """A worker whose report is edited by ``edit`` (role-specific breakage)."""

    def __init__(self, service: WorkerService, edit: Callable[[StepReport], StepReport]) -> None:
        self.service = service
        self.edit = edit

    def start_step(self, orders: StepOrders, wall_now: float) -> None:
        self.service.start_step(orders, wall_now)

    def wait_for_layer(self, layer: str) -> None:
        self.service.wait_for_layer(layer)

    def save_layer(self, layer: str) -> None:
        self.service.save_layer(layer)

    def end_forward(self) -> None:
        self.service.end_forward()

    def finish_step(self) -> StepReport:
        return self.edit(self.service.finish_step())


def broken(role: str, edit: Callable[[StepReport], StepReport]) -> Callable[..., Worker]:
    def wrap(which: str, service: WorkerService) -> Worker:
        return Tampered(service, edit) if which == role else service

    return wrap


def violation_of(sim: Simulation) -> InvariantViolationError:
    result = sim.run()
    assert result.violation is not None, "the broken worker went unnoticed"
    return result.violation


def test_a_block_set_released_twice_is_caught() -> None:
    seen: list[set[str]] = []

    def repeat_releases(report: StepReport) -> StepReport:
        again = seen.pop() if seen else set()
        seen.append(set(report.finished_sending))
        report.finished_sending |= again
        return report

    sim = Simulation(
        5, 40, READ, workload=quiet(5, READ), wrap_service=broken("producer", repeat_releases)
    )
    exc = violation_of(sim)
    assert exc.kind is Violation.RELEASED_TWICE
    assert "holds no blocks" in str(exc)


def test_a_load_error_reported_as_success_is_caught() -> None:
    def hide_errors(report: StepReport) -> StepReport:
        report.invalid_block_ids.clear()
        report.failed_recving.clear()
        return report

    workload = quiet(7, READ, engine=EngineFaultPlan(failed=0.3))
    sim = Simulation(7, 40, READ, workload=workload, wrap_service=broken("consumer", hide_errors))
    exc = violation_of(sim)
    assert exc.kind is Violation.CORRUPT_KV
    assert "differ from the producer's KV" in str(exc)


def test_a_load_never_reported_is_caught_past_its_deadline() -> None:
    def swallow(report: StepReport) -> StepReport:
        report.finished_recving.clear()
        report.failed_recving.clear()
        return report

    sim = Simulation(
        9, 40, WRITE, workload=quiet(9, WRITE), wrap_service=broken("consumer", swallow)
    )
    exc = violation_of(sim)
    assert exc.kind is Violation.PAST_DEADLINE
    assert "past its deadline" in str(exc)


def test_a_load_error_reported_a_step_late_is_caught() -> None:
    late: list[set[int]] = []

    def delay_errors(report: StepReport) -> StepReport:
        held = late.pop() if late else set()
        late.append(set(report.invalid_block_ids))
        report.invalid_block_ids.clear()
        report.invalid_block_ids |= held
        return report

    workload = quiet(13, READ, engine=EngineFaultPlan(failed=0.2))
    sim = Simulation(13, 40, READ, workload=workload, wrap_service=broken("consumer", delay_errors))
    assert violation_of(sim).kind in (Violation.LATE_LOAD_ERROR, Violation.CORRUPT_KV)


def test_a_write_into_a_free_block_is_caught() -> None:
    holder: list[Simulation] = []

    def scribble(report: StepReport) -> StepReport:
        consumer = holder[0].consumer
        assert consumer is not None
        free = consumer.pool.free_blocks()
        if free:
            consumer.memory.buffer[0, 0, free[0]] = 7  # a late DMA into a freed block
        return report

    sim = Simulation(
        17, 40, WRITE, workload=quiet(17, WRITE), wrap_service=broken("consumer", scribble)
    )
    holder.append(sim)
    exc = violation_of(sim)
    assert exc.kind is Violation.STRAY_WRITE


def test_a_buffer_beyond_its_bound_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_checks_module, "MAX_EARLY_BLOCKS", 0)
    workload = quiet(19, WRITE, requests=60)
    workload = dataclasses.replace(
        workload, shape=dataclasses.replace(workload.shape, chunk_tokens=4, token_budget=8)
    )
    exc = violation_of(Simulation(19, 60, WRITE, workload=workload))
    assert exc.kind is Violation.BUFFER_BOUND
    assert "early remote_blocks" in str(exc)


def test_a_dead_control_listener_is_caught() -> None:
    def close_channel(service: WorkerService) -> Callable[[StepReport], StepReport]:
        def edit(report: StepReport) -> StepReport:
            service.ctx.channel.close()
            return report

        return edit

    def wrap(which: str, service: WorkerService) -> Worker:
        return Tampered(service, close_channel(service)) if which == "producer" else service

    exc = violation_of(Simulation(23, 20, READ, workload=quiet(23, READ, 20), wrap_service=wrap))
    assert exc.kind is Violation.LISTENER_DEAD


def test_an_exception_in_a_worker_is_reported_with_where_it_came_from() -> None:
    def explode(report: StepReport) -> StepReport:
        raise KeyError("boom")

    sim = Simulation(
        29, 10, READ, workload=quiet(29, READ, 10), wrap_service=broken("producer", explode)
    )
    exc = violation_of(sim)
    assert exc.kind is Violation.CRASH
    assert "KeyError" in str(exc)
    assert "test_simulation.py" in str(exc)


def test_a_failing_seed_prints_a_one_line_reproduction_command() -> None:
    result = RunResult(seed=1234, mode=WRITE, requests=100)
    result.violation = InvariantViolationError(Violation.CORRUPT_KV, "example")
    report = SimReport()
    report.add(result)
    assert not report.ok
    command = "python -m moriio_tools.sim --seed 1234 --mode write --requests 100"
    assert result.repro == command
    assert f"reproduce: {command}" in report.summary()


def test_the_command_line_replays_one_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["--seed", "2", "--mode", "read", "--requests", "30"]) == 0
    out = capsys.readouterr().out
    assert "seed 2 (read), 30 requests" in out
    assert "invariants hold" in out


def test_the_command_line_summarises_many_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["--seed", "0", "--seeds", "4", "--requests", "20"]) == 0
    out = capsys.readouterr().out
    assert "runs: 4 (read 2, write 2)" in out
    assert "invariant violations: 0" in out


# -- the checkers on their own -----------------------------------------------------------------


def test_block_pool_reuses_the_latest_freed_blocks_and_refuses_double_frees() -> None:
    pool = BlockPool("p", 5)  # block 0 is the null block: never handed out
    assert pool.allocate("a", 2) == (1, 2)
    assert pool.allocate("b", 3) is None
    assert pool.free("a", "done") == (1, 2)
    assert pool.allocate("c", 1) == (1,)
    with pytest.raises(InvariantViolationError, match="released_twice"):
        pool.free("a", "again")
    with pytest.raises(InvariantViolationError, match="never_released: p: 1 request"):
        check_all_free(pool)


def test_deadline_buffer_listener_and_late_error_checks() -> None:
    check_deadline("x", since=1.0, budget=2.0, now=3.05, poll=0.1)
    with pytest.raises(InvariantViolationError, match="past_deadline"):
        check_deadline("x", since=1.0, budget=2.0, now=3.2, poll=0.1)
    check_buffers([BufferReading("inbox", 4, 4)])
    with pytest.raises(InvariantViolationError, match="inbox holds 5 entries, over its bound 4"):
        check_buffers([BufferReading("inbox", 5, 4)])
    check_listeners({"a": True})
    with pytest.raises(InvariantViolationError, match="listener dead on b"):
        check_listeners({"a": True, "b": False})
    check_load_errors({1, 2}, [1, 2, 3], "c")
    with pytest.raises(InvariantViolationError, match="late_load_error"):
        check_load_errors({4}, [1, 2, 3], "c")


# -- regressions: bugs the simulation found in the worker services ----------------------------


@pytest.mark.parametrize(("seed", "mode"), [(25, READ), (100, WRITE)])
def test_an_expired_hand_off_is_never_reported_as_sent_again(seed: int, mode: TransferMode) -> None:
    """Seeds that found it: a transfer ended in the pump that opens the step which carries
    its lease-expiry drop, so the worker reported blocks the scheduler had already freed."""
    result = Simulation(seed, 100, mode).run()
    assert result.violation is None, result.violation


@pytest.mark.parametrize("seed", [6, 10])
def test_a_failed_read_reports_its_load_error_in_its_own_step(seed: int) -> None:
    """Seeds that found it: one layer's read failed while another layer's batch was still
    in flight; the wait returned, the forward ran, and the error came a step late."""
    result = Simulation(seed, 100, READ).run()
    assert result.violation is None, result.violation


@pytest.mark.parametrize("seed", [597, 1404, 6481])
def test_writes_never_land_in_blocks_the_consumer_gave_up(seed: int) -> None:
    """Seeds that found it: the consumer stopped waiting (deadline, or an abort whose release
    was lost) while the producer still attached late remote_blocks and wrote."""
    result = Simulation(seed, 100, WRITE).run()
    assert result.violation is None, result.violation
    assert result.faults


# -- regressions: a peer restarted on its old address is a new instance ------------------------


def restarted(seed: int, mode: TransferMode, fault: NodeFault) -> Workload:
    workload = quiet(seed, mode, requests=60)
    profile = dataclasses.replace(
        workload.faults, node_fault=fault, node_fault_tick=10, restart_after=2
    )
    return dataclasses.replace(workload, faults=profile)


def failures_by_kind(sim: Simulation) -> Counter[str]:
    kinds: Counter[str] = Counter()
    for stack in sim.stacks:
        kinds.update(stack.service.ctx.counters.failures_by_kind)
    return kinds


@pytest.mark.parametrize(
    ("mode", "fault"),
    [(READ, NodeFault.PRODUCER_RESTART), (WRITE, NodeFault.CONSUMER_RESTART)],
)
def test_transfers_recover_after_a_peer_restarts_on_its_address(
    mode: TransferMode, fault: NodeFault
) -> None:
    """The cached handshake of the dead instance is replaced once a transfer names the new
    one; requests sent after the restart load again (recovery is an invariant)."""
    assert SimConfig().recovery_is_invariant
    sim = Simulation(31, 60, mode, workload=restarted(31, mode, fault))
    result = sim.run()
    assert result.violation is None, result.violation
    assert result.faults[str(fault)] == 1
    assert result.outcomes[Outcome.LOADED] >= 40
    peers = [s.service.ctx.peers for s in sim.stacks if s.service.ctx.peers.restarts_seen]
    assert len(peers) == 1  # the surviving side saw the restart and handshook again


@pytest.mark.parametrize("seed", [5797, 572])
def test_a_restarted_consumer_never_receives_writes_meant_for_its_predecessor(seed: int) -> None:
    """Seeds that found it: the producer handshook the restarted consumer, then honoured
    remote_blocks its predecessor had sent, writing into the new process's blocks."""
    sim = Simulation(seed, 100, WRITE)
    result = sim.run()
    assert result.violation is None, result.violation
    assert result.faults[NodeFault.CONSUMER_RESTART] == 1
    assert failures_by_kind(sim)["restarted"] >= 1  # the predecessor's blocks were refused


def test_a_restarted_producer_never_serves_reads_minted_by_its_predecessor() -> None:
    """Seed 849 (2244 before hand-offs were signed, 2130 while a read posted one batch per
    layer, 346 before reads went asynchronous): once a read failure made the consumer
    handshake again, reads of the dead producer's blocks would have been served from the
    restarted producer's memory. (With the hosts' clocks in step: the skew changes which
    reads are refused.)"""
    config = CLOCKS_IN_STEP_NO_LIVENESS
    sim = Simulation(849, 100, READ, config=config, workload=restart_workload(849))
    result = sim.run()
    assert result.violation is None, result.violation
    assert result.faults[NodeFault.PRODUCER_RESTART] == 1
    assert failures_by_kind(sim)["restarted"] >= 1  # the predecessor's reads were refused


def restart_workload(seed: int) -> Workload:
    return without_fence_faults(seeded_workload(seed, 100, READ, CLOCKS_IN_STEP_NO_LIVENESS))


def _ignore_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    """Peers that ignore instance ids."""
    connect = PeerDirectory.connect

    def any_instance(
        self: PeerDirectory, address: PeerAddress, instance_id: str | None = None
    ) -> ConnectedPeer:
        return connect(self, address, None)

    monkeypatch.setattr(PeerDirectory, "connect", any_instance)
    monkeypatch.setattr(PeerDirectory, "_check_instance", lambda *_: None)
    monkeypatch.setattr(PeerDirectory, "_serves", lambda *_: True)


@pytest.mark.parametrize(("seed", "mode"), [(5797, WRITE), (849, READ)])
def test_without_instance_checks_the_restart_seeds_corrupt_kv(
    seed: int, mode: TransferMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: peers that ignore instance ids (and, READ, the instance and key a
    hand-off's tag binds) let those seeds corrupt KV."""
    _ignore_instances(monkeypatch)
    monkeypatch.setattr(read_side, "handoff_problem", lambda *_: None)
    workload = restart_workload(seed) if mode is READ else None
    config = CLOCKS_IN_STEP_NO_LIVENESS
    result = Simulation(seed, 100, mode, config=config, workload=workload).run()
    assert result.violation is not None
    assert result.violation.kind in (Violation.STRAY_WRITE, Violation.CORRUPT_KV)


def test_without_instance_checks_a_restarted_producers_tags_still_refuse_its_predecessors_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The READ restart seed with instance checks off: a restarted producer signs with
    another key (and instance id), so its predecessor's hand-offs are refused by their tag."""
    _ignore_instances(monkeypatch)
    config = CLOCKS_IN_STEP_NO_LIVENESS
    sim = Simulation(849, 100, READ, config=config, workload=restart_workload(849))
    result = sim.run()
    assert result.violation is None, result.violation
    assert failures_by_kind(sim)["bad_tag"] >= 1


def test_seed_48303_never_writes_into_consumer_blocks_given_back() -> None:
    """Seed 48303 found it: a ``remote_blocks`` delayed past the consumer's deadline, whose
    abort release was lost too, was still honoured, and the producer wrote into blocks the
    consumer had given back and reallocated. The write-by lease refuses such announcements."""
    sim = Simulation(48303, 100, WRITE)
    result = sim.run()
    assert result.violation is None, result.violation
    assert result.faults[ChannelFault.DELAYED] > 0
    producer = sim.stacks[0].service.ctx.counters
    assert producer.late_announcements > 0
    assert sum(s.service.ctx.counters.late_announcements for s in sim.stacks[1:]) == 0


@pytest.mark.parametrize("seed", [7, 8])
def test_each_host_runs_on_its_own_skewed_wall_clock(seed: int) -> None:
    sim = Simulation(seed, 20, WRITE)
    offsets = [s.service.ctx.wall_now() - sim.clock.now() for s in sim.stacks]
    half = sim.config.timing.clock_skew_allowance / 2 * sim.workload.faults.skew
    assert sim.workload.faults.skew > 0
    assert len(set(offsets)) == 2
    assert all(0 < abs(o) <= half for o in offsets)
    assert sim.result.faults["clock_skew"] == 2
    assert Simulation(5, 20, WRITE, config=CLOCKS_IN_STEP).stacks[0].service.ctx.wall_now() == 0


def test_without_the_write_by_lease_a_late_announcement_corrupts_kv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control: a producer that ignores the write-by lease honours a delayed
    ``remote_blocks`` after the consumer gave its blocks back (seed 53019, found by searching
    seeds for that violation with the lease off, the fence as short as it was when seed 48303
    first found it, and without the late-completion faults; 52900 while a write posted one
    batch per layer)."""
    seed = 53019
    config = SimConfig(timing=Timing(quarantine_timeout=0.001, liveness_timeout=0.0))
    workload = without_fence_faults(seeded_workload(seed, 100, WRITE, config))
    monkeypatch.setattr(WritePusher, "_lease_refusal", lambda *_: None)
    result = Simulation(seed, 100, WRITE, config=config, workload=workload).run()
    assert result.violation is not None
    assert result.violation.kind is Violation.STRAY_WRITE
    monkeypatch.undo()
    assert Simulation(seed, 100, WRITE, config=config, workload=workload).run().violation is None


def without_fence_faults(workload: Workload) -> Workload:
    """``workload`` with no late completions, lost cancels, stuck statuses or NIC faults, and
    the full clock skew: what every seed ran before those faults existed."""
    engine = dataclasses.replace(
        workload.faults.engine, late=0.0, lost_cancel=0.0, stuck_after_remove=0.0
    )
    faults = dataclasses.replace(workload.faults, engine=engine, skew=1.0, retirements=())
    return dataclasses.replace(workload, faults=faults)


# -- quarantine: transfers that may still land keep their memory -------------------------------


def _without_quarantine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poster that hands a timed-out batch's memory back at once (its DMA runs on)."""
    finish = Poster._finish

    def at_once(
        self: Poster,
        key: int,
        entry: Any,
        ok: bool,
        message: str,
        *,
        quarantine: bool = False,
        late: bool = False,
    ) -> None:
        finish(self, key, entry, ok, message)

    monkeypatch.setattr(Poster, "_finish", at_once)


@pytest.mark.parametrize(("seed", "mode"), [(4, READ), (42, READ), (14, WRITE), (57, WRITE)])
def test_late_completions_never_land_in_blocks_given_back(
    seed: int, mode: TransferMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeds whose late completions (DMAs that outlive their timeout) land in blocks given
    back and reused when nothing quarantines them; with the quarantine they hold."""
    result = Simulation(seed, 100, mode, config=NO_LIVENESS).run()
    assert result.violation is None, result.violation
    assert result.faults[EngineFault.LATE] > 0
    _without_quarantine(monkeypatch)
    broken = Simulation(seed, 100, mode, config=NO_LIVENESS).run()
    assert broken.violation is not None
    assert broken.violation.kind is Violation.STRAY_WRITE


# -- NIC faults: mori 1.2.4 retires every connection of a node ----------------------------------


def with_retirements(seed: int, mode: TransferMode) -> Workload:
    """``seed``'s workload with a NIC fault on the posting node every 7 ticks."""
    workload = seeded_workload(seed, 100, mode)
    role = "consumer" if mode is READ else "producer"
    retirements = tuple((tick, role) for tick in range(5, 200, 7))
    return dataclasses.replace(
        workload, faults=dataclasses.replace(workload.faults, retirements=retirements)
    )


@pytest.mark.parametrize(("seed", "mode"), [(9, READ), (1, WRITE)])
def test_nic_faults_fail_in_flight_batches_and_every_invariant_holds(
    seed: int, mode: TransferMode
) -> None:
    """In-flight batches fail at once, some of their bytes land after that: nothing they
    fence is handed back before they are quiet."""
    sim = Simulation(seed, 100, mode, workload=with_retirements(seed, mode))
    result = sim.run()
    assert result.violation is None, result.violation
    assert result.faults[EngineFault.RETIRED] > 0
    assert sum(stack.engine.retired_landings for stack in sim.stacks) > 0


@pytest.mark.parametrize(("seed", "mode"), [(1, READ), (1, WRITE)])
def test_a_transport_that_calls_retired_batches_quiet_is_caught(
    seed: int, mode: TransferMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: an engine that reports a retired batch settled while its bytes may
    still land lets them land in memory already handed back."""
    settled = ChaosTransferEngine.settled

    def quiet_when_retired(self: ChaosTransferEngine, handle: TransferHandle) -> bool:
        batch = self._batches.get(handle)
        return (batch is not None and batch.retired) or settled(self, handle)

    monkeypatch.setattr(ChaosTransferEngine, "settled", quiet_when_retired)
    result = Simulation(seed, 100, mode, workload=with_retirements(seed, mode)).run()
    assert result.violation is not None
    assert result.violation.kind is Violation.STRAY_WRITE
