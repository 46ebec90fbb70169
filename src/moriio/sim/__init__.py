"""Deterministic fault-injection simulation of a producer and a consumer.

``run_seeds(range(...), requests, mode)`` runs many seeded simulations and reports runs,
faults injected per kind and invariant violations; ``python -m moriio.sim --seed N`` replays
one run.
"""

from moriio.sim.config import RunResult, SimConfig, seeded_workload
from moriio.sim.invariants import InvariantViolationError, Violation
from moriio.sim.report import SimReport, run_seeds
from moriio.sim.run import Simulation, run_one

__all__ = [
    "InvariantViolationError",
    "RunResult",
    "SimConfig",
    "SimReport",
    "Simulation",
    "Violation",
    "run_one",
    "run_seeds",
    "seeded_workload",
]
