"""Run every contract check against fresh harnesses of one engine kind."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from moriio.testing.contract.checks import ENGINE_CHECKS, Check
from moriio.testing.contract.harness import EngineHarness, UnsupportedConditionError


class ContractViolationError(AssertionError):
    """A check failed; the message names the check and the engine kind."""


@dataclass
class ContractReport:
    """Which checks passed and which did not apply (with the engine's reason)."""

    kind: str
    passed: list[str] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)


def run_engine_contract(
    make_harness: Callable[[], EngineHarness], checks: Sequence[Check] = ENGINE_CHECKS
) -> ContractReport:
    """Run ``checks`` in order, each on a new harness that is closed afterwards.

    Raises :class:`ContractViolationError` at the first check that fails.
    """
    report: ContractReport | None = None
    for check in checks:
        harness = make_harness()
        report = report or ContractReport(harness.kind)
        try:
            check.run(harness)
        except UnsupportedConditionError as reason:
            report.unsupported[check.name] = str(reason)
        except Exception as error:
            raise ContractViolationError(f"{harness.kind}: {check.name} failed: {error}") from error
        else:
            report.passed.append(check.name)
        finally:
            harness.close()
    return report or ContractReport("")
