"""The TransferEngine and ControlChannel contracts as a library, run through harnesses.

A connector implements :class:`EngineHarness` for its engine (how to build one, and how to
provoke backpressure, a held transfer and a dead peer where it can), then either calls
:func:`run_engine_contract` or parametrizes its own test over :data:`ENGINE_CHECKS`. A channel
kind implements :class:`ChannelHarness` (how to build a channel that reaches the others) and
parametrizes its test over :data:`CHANNEL_CHECKS`; :class:`PingCodec` is their test codec.
"""

from moriio.testing.contract.channel_checks import CHANNEL_CHECKS, ChannelCheck
from moriio.testing.contract.channel_harness import (
    ChannelHarness,
    CountingChannel,
    InMemoryChannelHarness,
    Msg,
    PingCodec,
    ping,
    receive,
)
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
    "CHANNEL_CHECKS",
    "ENGINE_CHECKS",
    "NUM_BLOCKS",
    "REGION_BYTES",
    "ChannelCheck",
    "ChannelHarness",
    "Check",
    "ContractViolationError",
    "ContractReport",
    "CountingChannel",
    "EngineHarness",
    "InMemoryChannelHarness",
    "InMemoryHarness",
    "Msg",
    "PingCodec",
    "UnsupportedConditionError",
    "pattern",
    "ping",
    "receive",
    "run_engine_contract",
    "share_region",
    "wait",
]
