"""One contract for every TransferEngine: the in-memory fake, NIXL for real, mori (stand-in).

The checks ship in :mod:`moriio.testing.contract`; this module supplies the NIXL and mori
harnesses (a peer process, the mori stand-in) and runs every check against each engine kind.
Where an engine cannot show a condition the check is skipped with the engine's reason.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from moriio.ports import (
    RemoteRegion,
    TransferEngine,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)
from moriio.testing.contract import (
    BLOCK,
    ENGINE_CHECKS,
    REGION_BYTES,
    Check,
    ContractViolationError,
    EngineHarness,
    InMemoryHarness,
    UnsupportedConditionError,
    pattern,
    run_engine_contract,
    share_region,
    wait,
)
from moriio.testing.contract.harness import i64
from moriio.testing.inmemory import InMemoryTransferEngine

# -- harnesses ---------------------------------------------------------------------------------


class MoriHarness(EngineHarness):
    kind = "mori-stand-in"  # the stand-in module, not mori: tests/stand_ins/mori

    def __init__(self, stand_in: ModuleType) -> None:
        super().__init__()
        self.stand_in = stand_in

    def create(self, name: str) -> TransferEngine:
        from moriio.adapters.mori import MoriTransferEngine

        return MoriTransferEngine(name, host="127.0.0.1", port=0)

    def inject_backpressure(self, engine: TransferEngine, count: int) -> None:
        self.stand_in.control(engine.name).sq_full_burst = count

    def hold_completion(self, engine: TransferEngine, hold: bool) -> bool:
        self.stand_in.control(engine.name).hold = hold
        return True

    def dead_peer(self, initiator: TransferEngine) -> RemoteRegion:
        doomed = self.engine("doomed")
        remote = share_region(self, doomed, initiator, pattern(99))
        self.stand_in.crash(doomed.name)  # the process is gone; nothing was closed
        return remote

    def close(self) -> None:
        super().close()
        self.stand_in.reset()


class NixlHarness(EngineHarness):
    kind = "nixl"
    target_needs_progress = (
        "UCX over TCP moves a one-sided READ or WRITE only while the target calls progress "
        "(moriio's workers keep doing so while idle: domain/worker/progress.py)"
    )

    def __init__(self) -> None:
        super().__init__()
        self.processes: list[subprocess.Popen[str]] = []
        self.holding: TransferEngine | None = None  # only it is pumped: its targets stall

    def create(self, name: str) -> TransferEngine:
        from moriio.adapters.nixl import NixlTransferEngine

        return NixlTransferEngine(f"{name}-{uuid.uuid4().hex[:6]}", loopback=True)

    def inject_backpressure(self, engine: TransferEngine, count: int) -> None:
        raise UnsupportedConditionError(
            "NIXL/UCX queues every request itself: it has no transient refusal"
        )

    def hold_completion(self, engine: TransferEngine, hold: bool) -> bool:
        """A target that calls no progress leaves ``engine``'s transfers in flight (see
        ``target_needs_progress``): while held, only ``engine`` is pumped."""
        self.holding = engine if hold else None
        return True

    def pump(self) -> None:
        if self.holding is None:
            super().pump()
        else:
            self.holding.progress()

    def dead_peer(self, initiator: TransferEngine) -> RemoteRegion:
        script = Path(__file__).with_name("nixl_peer_process.py")
        process = subprocess.Popen(
            [sys.executable, str(script), str(REGION_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.processes.append(process)
        assert process.stdout is not None
        lines: dict[str, bytes] = {}
        while len(lines) < 2:
            line = process.stdout.readline()
            assert line, "the NIXL peer process exited before describing its region"
            key, _, value = line.strip().partition(" ")
            if key in ("METADATA", "DESCRIPTOR"):
                lines[key] = bytes.fromhex(value)
        peer = initiator.add_peer(lines["METADATA"])
        remote = initiator.import_region(peer, lines["DESCRIPTOR"])
        # Wire the connection up with one good transfer, then kill the peer.
        scratch = np.zeros(BLOCK, dtype=np.uint8)
        self.buffers.append(scratch)
        local = initiator.register_region(scratch.ctypes.data, scratch.nbytes)
        handle = initiator.post(
            TransferOp.READ, local, remote, i64([0]), i64([0]), i64([BLOCK]), "wire"
        )
        assert wait(self, initiator, handle).state is TransferState.SUCCEEDED
        initiator.release(handle)
        process.kill()
        process.wait()
        return remote

    def close(self) -> None:
        super().close()
        for process in self.processes:
            process.kill()
            process.wait()


# -- the contract, per engine kind ------------------------------------------------------------


@pytest.fixture(
    params=[
        "inmemory",
        pytest.param("nixl", marks=pytest.mark.integration),
        "mori-stand-in",
    ]
)
def make_harness(request: pytest.FixtureRequest) -> Callable[[], EngineHarness]:
    if request.param == "inmemory":
        return InMemoryHarness
    if request.param == "nixl":
        pytest.importorskip("nixl_cu12", reason="NIXL is not installed")
        return NixlHarness
    stand_in = request.getfixturevalue("mori_stand_in")
    return lambda: MoriHarness(stand_in)


@pytest.fixture
def harness(make_harness: Callable[[], EngineHarness]) -> Iterator[EngineHarness]:
    built = make_harness()
    try:
        yield built
    finally:
        built.close()


# Known deviations from the port, kept visible: each fails the suite once it is fixed.
KNOWN_DEVIATIONS: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize("check", ENGINE_CHECKS, ids=lambda check: check.name)
def test_engine_contract(
    harness: EngineHarness, check: Check, request: pytest.FixtureRequest
) -> None:
    deviation = KNOWN_DEVIATIONS.get((harness.kind, check.name))
    if deviation is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=deviation))
    try:
        check.run(harness)
    except UnsupportedConditionError as reason:
        pytest.skip(str(reason))


# -- the runner other connectors call ----------------------------------------------------------


def test_run_engine_contract_reports_every_check_of_a_conforming_engine() -> None:
    report = run_engine_contract(InMemoryHarness)
    assert report.kind == "inmemory"
    assert report.passed == [check.name for check in ENGINE_CHECKS]
    assert report.unsupported == {}


class _NeverClosingEngine(InMemoryTransferEngine):
    def close(self) -> None:
        pass


class _NeverClosingHarness(InMemoryHarness):
    kind = "never-closing"

    def create(self, name: str) -> TransferEngine:
        return _NeverClosingEngine(name, self.fabric)


def test_run_engine_contract_names_the_first_broken_promise() -> None:
    # A peer that never closes never dies: the dead-peer check is the first to notice.
    broken = "never-closing: dead_peer_gives_a_sticky_terminal_failure failed: .*not FAILED"
    with pytest.raises(ContractViolationError, match=broken):
        run_engine_contract(_NeverClosingHarness)
    closed = [check for check in ENGINE_CHECKS if check.name == "closed_engine_refuses_work"]
    with pytest.raises(ContractViolationError, match="closed_engine_refuses_work failed"):
        run_engine_contract(_NeverClosingHarness, closed)


class _CancelDropsBytesEngine(InMemoryTransferEngine):
    """Deliberately broken: a cancelled batch reports success without moving its bytes."""

    def cancel(self, handle: TransferHandle) -> None:
        with self._lock:
            batch = self._batches[handle]
            if batch.status.state is TransferState.IN_PROGRESS:
                batch.status = TransferStatus(TransferState.SUCCEEDED)


class _CancelDropsBytesHarness(InMemoryHarness):
    kind = "cancel-drops-bytes"

    def create(self, name: str) -> TransferEngine:
        return _CancelDropsBytesEngine(name, self.fabric)


def test_a_fake_that_drops_a_cancelled_batchs_bytes_breaks_the_contract() -> None:
    cancel = [c for c in ENGINE_CHECKS if c.name.startswith("cancel_")]
    assert len(cancel) == 2
    broken = "cancel-drops-bytes: cancel_keeps_the_batch_known_until_it_settles failed"
    with pytest.raises(ContractViolationError, match=broken):
        run_engine_contract(_CancelDropsBytesHarness, cancel)


class _ReleaseScribblesEngine(InMemoryTransferEngine):
    """Deliberately broken: a batch released in progress lands bytes of no source."""

    def release(self, handle: TransferHandle) -> None:
        with self._lock:
            batch = self._batches.get(handle)
            in_flight = batch is not None and batch.status.state is TransferState.IN_PROGRESS
            super().release(handle)
            if batch is None or not in_flight:
                return
            region = self._regions[batch.record.local_region]
            for offset, size in zip(batch.record.local_offsets, batch.record.sizes, strict=True):
                ctypes.memset(region.addr + int(offset), 0xA5, int(size))


class _SlowTargetHarness(InMemoryHarness):
    """A fake whose targets serve peers only when they call progress, but says otherwise."""

    kind = "slow-target"

    def create(self, name: str) -> TransferEngine:
        engine = InMemoryTransferEngine(name, self.fabric, complete_after_polls=2)
        engine.serves_only_when_progressed = True
        return engine


def _checks(*names: str) -> list[Check]:
    found = [check for check in ENGINE_CHECKS if check.name in names]
    assert len(found) == len(names)
    return found


def test_a_fake_whose_release_writes_other_bytes_breaks_the_contract() -> None:
    class Harness(InMemoryHarness):
        kind = "release-scribbles"

        def create(self, name: str) -> TransferEngine:
            return _ReleaseScribblesEngine(name, self.fabric, complete_after_polls=2)

    check = "release_in_flight_forgets_the_batch_and_the_engine_goes_on"
    broken = f"release-scribbles: {check} failed: a released batch wrote bytes of no source"
    with pytest.raises(ContractViolationError, match=broken):
        run_engine_contract(Harness, _checks(check))


def test_a_target_that_must_progress_is_caught_unless_declared() -> None:
    check = "transfers_complete_while_only_the_initiator_drives_progress"
    with pytest.raises(ContractViolationError, match=f"slow-target: {check} failed"):
        run_engine_contract(_SlowTargetHarness, _checks(check))

    class Declared(_SlowTargetHarness):
        target_needs_progress = "this fake serves peers only when it steps"

    report = run_engine_contract(Declared, _checks(check, "read_copies_remote_bytes"))
    assert report.passed == ["read_copies_remote_bytes"]  # with both sides pumped it moves
    assert report.unsupported == {check: "slow-target: this fake serves peers only when it steps"}


def test_run_engine_contract_lists_what_an_engine_cannot_show() -> None:
    class NoBackpressure(InMemoryHarness):
        def inject_backpressure(self, engine: TransferEngine, count: int) -> None:
            raise UnsupportedConditionError("no transient refusal")

    checks = [
        c
        for c in ENGINE_CHECKS
        if c.name in ("backpressure_then_success", "read_copies_remote_bytes")
    ]
    report = run_engine_contract(NoBackpressure, checks)
    assert report.passed == ["read_copies_remote_bytes"]
    assert report.unsupported == {"backpressure_then_success": "no transient refusal"}
