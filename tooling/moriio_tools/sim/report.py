"""Many seeded runs: faults injected per kind, outcomes and invariant violations, summed."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from moriio.domain.values.modes import TransferMode
from moriio_tools.sim.config import RunResult
from moriio_tools.sim.run import run_one

ModeChoice = TransferMode | Literal["read", "write", "both"]


@dataclass(frozen=True, slots=True)
class ViolationRecord:
    """One failed run: what broke, and the command that replays it."""

    seed: int
    mode: TransferMode
    kind: str
    message: str
    repro: str

    def __str__(self) -> str:
        return f"seed {self.seed} ({self.mode.value}): {self.message}\n  reproduce: {self.repro}"


@dataclass(slots=True)
class SimReport:
    """The sum of many runs."""

    runs: int = 0
    requests: int = 0
    ticks: int = 0
    runs_by_mode: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    violations: list[ViolationRecord] = field(default_factory=list)
    findings: list[ViolationRecord] = field(default_factory=list)
    """Liveness findings (see ``SimConfig.recovery_is_invariant``), not invariant breaks."""

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def faults_injected(self) -> int:
        return sum(self.faults.values())

    def add(self, result: RunResult) -> None:
        self.runs += 1
        self.requests += result.requests
        self.ticks += result.ticks
        self.runs_by_mode[result.mode.value] += 1
        self.faults.update(result.faults)
        self.outcomes.update(result.outcomes)
        for problem, into in ((result.violation, self.violations), (result.finding, self.findings)):
            if problem is not None:
                into.append(
                    ViolationRecord(
                        seed=result.seed,
                        mode=result.mode,
                        kind=problem.kind.value,
                        message=str(problem),
                        repro=result.repro,
                    )
                )

    def merge(self, other: SimReport) -> None:
        self.runs += other.runs
        self.requests += other.requests
        self.ticks += other.ticks
        self.runs_by_mode.update(other.runs_by_mode)
        self.faults.update(other.faults)
        self.outcomes.update(other.outcomes)
        self.violations.extend(other.violations)
        self.findings.extend(other.findings)

    def summary(self) -> str:
        """A few human-readable lines: runs, faults per kind, outcomes, violations."""
        modes = ", ".join(f"{m} {n}" for m, n in sorted(self.runs_by_mode.items()))
        lines = [
            f"runs: {self.runs} ({modes}), requests: {self.requests}, ticks: {self.ticks}",
            f"faults injected: {self.faults_injected}",
            *(f"  {kind}: {n}" for kind, n in sorted(self.faults.items())),
            "outcomes: " + ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes.items())),
            f"invariant violations: {len(self.violations)}",
            *(f"  {v}" for v in self.violations[:20]),
        ]
        if self.findings:
            by_kind = Counter(f.kind for f in self.findings)
            lines.append(
                "liveness findings (not invariants): "
                + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
            )
            lines += [f"  {f}" for f in self.findings[:5]]
        return "\n".join(lines)


def mode_of(seed: int, mode: ModeChoice) -> TransferMode:
    """The mode of ``seed``'s run: ``"both"`` alternates READ (even) and WRITE (odd)."""
    if isinstance(mode, TransferMode):
        return mode
    if mode == "both":
        return TransferMode.READ if seed % 2 == 0 else TransferMode.WRITE
    return TransferMode(mode)


def _run_chunk(seeds: Sequence[int], requests: int, mode: ModeChoice) -> SimReport:
    report = SimReport()
    for seed in seeds:
        report.add(run_one(seed, requests, mode_of(seed, mode)))
    return report


def _chunks(seeds: Sequence[int], size: int) -> Iterable[Sequence[int]]:
    for start in range(0, len(seeds), size):
        yield seeds[start : start + size]


def run_seeds(
    seeds: range, requests: int, mode: ModeChoice = "both", *, workers: int = 1
) -> SimReport:
    """Run one simulation per seed (``workers`` processes) and sum their reports.

    ``mode`` is a :class:`TransferMode`, ``"read"``, ``"write"`` or ``"both"`` (alternating
    by seed). Runs are independent, so the report does not depend on ``workers``.
    """
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    mode_of(seeds.start, mode)  # validates mode
    if workers == 1 or len(seeds) < 2:
        return _run_chunk(seeds, requests, mode)
    size = max(1, min(50, len(seeds) // (workers * 4) or 1))
    report = SimReport()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_run_chunk, c, requests, mode) for c in _chunks(seeds, size)]
        for future in futures:
            report.merge(future.result())
    report.violations.sort(key=lambda v: (v.seed, v.mode.value))
    report.findings.sort(key=lambda v: (v.seed, v.mode.value))
    return report


def default_workers() -> int:
    """Worker processes for this machine (its CPU count, at least 1)."""
    return max(1, os.cpu_count() or 1)
