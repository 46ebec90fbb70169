"""The TransferEngine contract as a library: run it against any engine through a harness.

A connector implements :class:`EngineHarness` for its engine (how to build one, and how to
provoke backpressure, a held transfer and a dead peer where it can), then either calls
:func:`run_engine_contract` or parametrizes its own test over :data:`ENGINE_CHECKS`.
"""

from moriio.testing.contract.checks import ENGINE_CHECKS, Check
from moriio.testing.contract.harness import (
    BLOCK,
    NUM_BLOCKS,
    REGION_BYTES,
    EngineHarness,
    UnsupportedConditionError,
    pattern,
    share_region,
    wait,
)
from moriio.testing.contract.inmemory import InMemoryHarness
from moriio.testing.contract.runner import (
    ContractReport,
    ContractViolationError,
    run_engine_contract,
)

__all__ = [
    "BLOCK",
    "ENGINE_CHECKS",
    "NUM_BLOCKS",
    "REGION_BYTES",
    "Check",
    "ContractViolationError",
    "ContractReport",
    "EngineHarness",
    "InMemoryHarness",
    "UnsupportedConditionError",
    "pattern",
    "run_engine_contract",
    "share_region",
    "wait",
]
