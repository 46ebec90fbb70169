"""Deterministic fault-injection simulation of a producer and a consumer.

``run_seeds(range(...), requests, mode)`` runs many seeded simulations and reports runs,
faults injected per kind and invariant violations; ``python -m moriio_tools.sim --seed N`` replays
one run.
"""

from moriio_tools.sim.config import RunResult, SimConfig, seeded_workload
from moriio_tools.sim.invariants import InvariantViolationError, Violation
from moriio_tools.sim.report import SimReport, run_seeds
from moriio_tools.sim.run import Simulation, run_one

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
