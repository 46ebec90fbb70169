"""The simulated requests: how each ended, their states on each node, and the node setting."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from moriio.domain.params.handoff_tags import PromptBinding
from moriio.domain.params.transfer_params import TransferParams
from moriio.domain.values.modes import TransferMode
from moriio.testing.handoffs import prompt_binding
from moriio.testing.stacks.stack import Timing
from moriio_tools.sim.workload import RequestPlan


class Outcome(enum.StrEnum):
    """How one request ended, seen from the client."""

    LOADED = "loaded"  # the consumer loaded KV identical to the producer's
    LOAD_ERROR = "load_error"  # the consumer reported a load error (and would recompute)
    LOCAL_HIT = "local_hit"  # nothing to load: the consumer computed it locally
    ABORTED = "aborted"  # aborted by the client before a load settled
    NOT_SERVED = "not_served"  # never reached the consumer (producer aborted, down or crashed)
    LOST = "lost"  # a node vanished with it


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def prompt_of(plan: RequestPlan, num_tokens: int | None = None) -> PromptBinding:
    """The binding of ``plan``'s prompt (first ``num_tokens`` tokens; default: all), the same
    on both engines: a simulated prompt is named by its uid."""
    return prompt_binding(f"sim-{plan.uid}", plan.tokens if num_tokens is None else num_tokens)


class PState(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    HELD = "held"  # finished; blocks held for the hand-off


@dataclass(slots=True, eq=False)
class ProducerRequest:
    plan: RequestPlan
    rid: str
    params: TransferParams
    state: PState = PState.WAITING
    since_tick: int = 0
    blocks: tuple[int, ...] = ()
    computed: int = 0
    held_since: float = 0.0


class DState(enum.Enum):
    WAITING = "waiting"
    AWAITING = "awaiting"  # WRITE: blocks allocated, waiting for the producer's writes
    ABORTED_AWAITING = "aborted_awaiting"  # finished, blocks kept until the writes end
    DECODING = "decoding"
    DONE = "done"  # blocks freed


@dataclass(slots=True, eq=False)
class ConsumerRequest:
    plan: RequestPlan
    rid: str
    params: TransferParams
    state: DState = DState.WAITING
    since_tick: int = 0
    awaiting_since: float = 0.0
    blocks: tuple[int, ...] = ()
    load_blocks: tuple[int, ...] = ()
    first_block: int = 0
    steps_left: int = 0
    outcome: Outcome | None = None


@dataclass(slots=True)
class NodeEnv:
    """What both nodes share: the mode, the timing and the clock reading."""

    mode: TransferMode
    timing: Timing
    num_layers: int
    block_size: int
    token_budget: int = 64
    chunk_tokens: int = 8
