"""What a simulation run is configured with and what it returns."""

from __future__ import annotations

import logging
import random
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from moriio.domain.params.orders import StepOrders
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.service import StepReport, WorkerService
from moriio.testing.stacks.stack import Timing
from moriio_tools.sim.invariants import InvariantViolationError
from moriio_tools.sim.workload import Workload, make_workload


class Worker(Protocol):
    """The worker hooks the simulated scheduler drives (a WorkerService, or a test double)."""

    def start_step(self, orders: StepOrders, wall_now: float) -> None: ...

    def wait_for_layer(self, layer: str) -> None: ...

    def save_layer(self, layer: str) -> None: ...

    def end_forward(self) -> None: ...

    def finish_step(self) -> StepReport: ...


ServiceWrapper = Callable[[str, WorkerService], Worker]
"""Hook for tests: wraps each new worker service (``"producer"`` or ``"consumer"``)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    num_layers: int = 2
    block_size: int = 4
    max_request_blocks: int = 6
    timing: Timing = field(default_factory=Timing)
    max_idle_ticks: int = 4000
    settle_ticks: int = 160  # between the last fault and the first clean request
    recovery_is_invariant: bool = True
    """Whether clean requests (sent after the faults stopped) that fail to load break an
    invariant (``no_recovery``). Off: they are only reported as liveness findings."""


@dataclass(slots=True)
class RunResult:
    seed: int
    mode: TransferMode
    requests: int
    ticks: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    violation: InvariantViolationError | None = None
    finding: InvariantViolationError | None = None  # a liveness finding (not an invariant)

    @property
    def repro(self) -> str:
        """The one-line command that replays this run."""
        return (
            f"python -m moriio_tools.sim --seed {self.seed} --mode {self.mode.value} "
            f"--requests {self.requests}"
        )


def run_key(seed: int, mode: TransferMode, requests: int) -> str:
    return f"moriio-sim/{seed}/{mode.value}/{requests}"


def generate(
    seed: int, rng: random.Random, requests: int, mode: TransferMode, config: SimConfig
) -> Workload:
    """``seed``'s workload; ``rng`` is the run's stream (the late, skew and NIC-retirement
    faults draw from their own, so adding them left every other draw of a seed as it was)."""
    key = run_key(seed, mode, requests)
    return make_workload(
        rng,
        mode,
        requests,
        config.block_size,
        config.max_request_blocks,
        config.settle_ticks,
        random.Random(f"{key}/fence"),
        random.Random(f"{key}/retire"),
    )


def seeded_workload(
    seed: int, requests: int, mode: TransferMode, config: SimConfig | None = None
) -> Workload:
    """The workload (requests, faults, sizes) that ``seed`` runs; tests edit and pass it back."""
    return generate(
        seed, random.Random(run_key(seed, mode, requests)), requests, mode, config or SimConfig()
    )


@contextmanager
def quiet_logs() -> Iterator[None]:
    """Silence moriio's per-failure warnings while runs inject thousands of failures."""
    logger = logging.getLogger("moriio")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def describe_crash(exc: Exception) -> str:
    """The exception and where it was raised (and the innermost moriio frame, if another)."""
    frames = traceback.extract_tb(exc.__traceback__)
    places = []
    if frames:
        places.append(frames[-1])
        ours = next((f for f in reversed(frames) if "/moriio/" in f.filename), None)
        if ours is not None and ours is not frames[-1]:
            places.append(ours)
    where = " via ".join(f"{f.filename.split('/src/')[-1]}:{f.lineno}" for f in places)
    return f"{type(exc).__name__}: {exc}" + (f" at {where}" if where else "")
