"""Per-step orders from the scheduler-side connector to its workers.

Each step carries only what changed (deltas), never the whole live transfer map. Orders are
NamedTuples: thousands are built per second on the scheduler's hot path.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from moriio.domain.kv.block_groups import BlockGroups
from moriio.domain.params.handoff_tags import HandoffCheck, PromptBinding
from moriio.domain.params.transfer_params import PeerEndpoint


class ReadOrder(NamedTuple):
    """Consumer READ: pull ``remote_block_ids`` into ``local_block_ids``.

    ``load_async``: the request waits outside the forward until the worker reports the load
    finished; otherwise the read must land before this step's forward uses the blocks.
    ``peer.instance_id`` names the producer instance that holds the blocks: no other instance
    at the producer's address ever serves (or is told to release) them. ``handoff``: what
    the worker verifies before it reads (None: the params were not signed, nothing is read).
    ``group_sizes``: how many of the pairs each KV-cache group holds, in group order (empty:
    one group).
    """

    request_id: str
    transfer_id: str
    local_block_ids: tuple[int, ...]
    remote_block_ids: tuple[int, ...]
    peer: PeerEndpoint
    lease_expires_at: float | None
    token: str = ""  # the producer's capability, echoed in every release
    load_async: bool = False
    handoff: HandoffCheck | None = None
    group_sizes: tuple[int, ...] = ()


class ReleaseOrder(NamedTuple):
    """Consumer: free the producer's blocks without reading (abort, full local prefix hit).

    Not sent when ``peer.instance_id`` is known to be gone (its blocks went with it). READ:
    sent only once ``handoff`` verified (a request may free only its own prompt's hand-off).
    """

    request_id: str
    transfer_id: str
    peer: PeerEndpoint
    token: str = ""
    handoff: HandoffCheck | None = None


class ExpectWriteOrder(NamedTuple):
    """Consumer WRITE: announce destination blocks to the producer and await ``write_done``.

    ``first_block`` is the index of the first announced block in the request's block list
    (blocks before it are local prefix-cache hits the producer must not overwrite).
    ``prompt``: the request's prompt binding, announced with the blocks: the producer pushes
    only KV computed for the same prompt.
    """

    request_id: str
    transfer_id: str
    local_block_ids: tuple[int, ...]
    first_block: int
    peer: PeerEndpoint
    prompt: PromptBinding | None = None


class AbortWriteOrder(NamedTuple):
    """Consumer WRITE: the request ended while writes may still land in its blocks."""

    request_id: str
    transfer_id: str


class SaveOrder(NamedTuple):
    """Producer WRITE: the prefill completes this step; push ``block_ids`` (one tuple per
    KV-cache group) layer by layer, into blocks announced with the same ``prompt`` binding."""

    request_id: str
    transfer_id: str
    block_ids: BlockGroups
    peer: PeerEndpoint | None
    prompt: PromptBinding | None = None


class HoldOrder(NamedTuple):
    """Producer: the request finished; its blocks stay allocated until the transfer ends.

    ``token``: the capability minted for the transfer (READ): only releases carrying it
    free the blocks. Empty: any release does (transfers handed off without one).
    """

    request_id: str
    transfer_id: str
    token: str = ""


class DropReason(enum.Enum):
    EXPIRED = "expired"  # the lease ran out; the scheduler reclaimed the blocks
    CANCELLED = "cancelled"  # the request ended before its KV was handed off


class DropOrder(NamedTuple):
    """Producer: forget the request; never report it again."""

    request_id: str
    transfer_id: str
    reason: DropReason


@dataclass(slots=True)
class StepOrders:
    """Everything the workers must start this step."""

    reads: list[ReadOrder] = field(default_factory=list)
    releases: list[ReleaseOrder] = field(default_factory=list)
    expect_writes: list[ExpectWriteOrder] = field(default_factory=list)
    abort_writes: list[AbortWriteOrder] = field(default_factory=list)
    saves: list[SaveOrder] = field(default_factory=list)
    holds: list[HoldOrder] = field(default_factory=list)
    drops: list[DropOrder] = field(default_factory=list)

    def is_empty(self) -> bool:
        """True when there is nothing for the workers to do."""
        return not (
            self.reads
            or self.releases
            or self.expect_writes
            or self.abort_writes
            or self.saves
            or self.holds
            or self.drops
        )
