"""Scheduler-side bookkeeping of a producer (prefill) engine: what both modes share.

Tracks the requests whose KV will be handed to a decode engine, decides when their blocks
may be freed, and emits per-step orders for the workers. All costs are per changed request:
nothing scans every live transfer on every step. The mode's book (:mod:`read_book`,
:mod:`write_book`) is chosen once, where the scheduler side is built.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from moriio.domain.kv.block_groups import AnyBlockIds
from moriio.domain.params.handoff_tags import PromptBinding
from moriio.domain.params.orders import DropOrder, DropReason, HoldOrder
from moriio.domain.params.outgoing_params import ReturnedParams
from moriio.domain.params.transfer_params import TransferParams
from moriio.domain.scheduler.pending_orders import PendingOrders
from moriio.domain.timing.policy import TransferPolicy


@dataclass(frozen=True, slots=True)
class LocalEndpoint:
    """How decode engines reach this engine (advertised in the returned params).

    ``instance_id``: this engine's incarnation (it changes on every restart), so that a
    consumer never reads blocks of a dead engine from the process that replaced it.
    ``dp_rank`` is the global DP rank; ``dp_size_local`` the DP ranks per node (0: unknown).
    """

    engine_id: str
    host: str
    handshake_port: int
    notify_port: int
    tp_size: int
    dp_size: int
    dp_rank: int
    instance_id: str
    dp_size_local: int = 0


class FinishDecision(NamedTuple):
    """What ``request_finished`` returns to vLLM."""

    delay_free: bool
    params: dict[str, Any] | None


NO_HAND_OFF = FinishDecision(False, None)


class ProducerBook(PendingOrders, ABC):
    """Producer scheduler state for one engine.

    ``claims_at_allocation``: whether :meth:`on_allocated` does anything (the scheduler side
    skips the call, and the parsing it needs, when it does not). ``handoff_key``: the key
    this engine signs its hand-offs with, which its workers give peers in handshakes (None:
    it signs nothing).
    """

    claims_at_allocation: ClassVar[bool]
    handoff_key: bytes | None = None

    def __init__(self, endpoint: LocalEndpoint, policy: TransferPolicy) -> None:
        """The lease handed out ends ``policy.defer_timeout`` after the finish on this host's
        wall clock; the blocks are reclaimed only ``policy.clock_skew_allowance`` later, so a
        consumer whose clock is behind ours by up to the allowance never reads them after
        their reuse."""
        if not isinstance(policy, TransferPolicy):
            raise TypeError(f"policy must be a TransferPolicy, got {policy!r}")
        super().__init__()
        self._endpoint = endpoint
        # Bound once: the finish of a request is a hot path.
        self._lease_end = policy.lease_end
        self._reclaim_deadline = policy.reclaim_deadline
        self._tracked: dict[str, TransferParams] = {}
        self._held: dict[str, str] = {}  # request id -> transfer id, blocks held for hand-off
        self._owner_of: dict[str, str] = {}  # transfer id -> the request tracked or held for it
        self._lease_heap: list[tuple[float, str]] = []
        self.expired_total = 0
        self._returned = ReturnedParams(
            engine_id=endpoint.engine_id,
            host=endpoint.host,
            handshake_port=endpoint.handshake_port,
            notify_port=endpoint.notify_port,
            tp_size=endpoint.tp_size,
            dp_size=endpoint.dp_size,
            dp_rank=endpoint.dp_rank,
            dp_size_local=endpoint.dp_size_local,
            instance_id=endpoint.instance_id,
        )

    def set_registration_generation(self, generation: int) -> None:
        """The generation the workers' KV memory is registered under now (see
        :mod:`moriio.domain.worker.generations`): named in every hand-off from now on."""
        self._returned.set_generation(generation)

    @property
    def num_tracked(self) -> int:
        return len(self._tracked)

    @property
    def num_held(self) -> int:
        return len(self._held)

    @abstractmethod
    def on_allocated(
        self,
        request_id: str,
        params: TransferParams | None,
        is_retry_of: Callable[[str], bool] | None = None,
    ) -> bool:
        """A request got blocks; False when it will not be handed off because another live
        request claims its transfer id (one id names one set of blocks, or a consumer could
        read, or free, the wrong ones). ``is_retry_of(owner)``: whether the request is a
        retry of the id's current owner (the same prompt), which a mode may let take over."""

    def _claim(self, transfer_id: str, request_id: str) -> bool:
        """Make ``request_id`` the one request handing off under ``transfer_id``."""
        return self._owner_of.setdefault(transfer_id, request_id) == request_id

    def _forget_owner(self, transfer_id: str, request_id: str) -> None:
        if self._owner_of.get(transfer_id) == request_id:
            del self._owner_of[transfer_id]

    @abstractmethod
    def is_pending_save(self, request_id: str) -> bool:
        """Whether the request's push waits for the step that completes its prefill."""

    @abstractmethod
    def pending_saves(self) -> list[str]:
        """Requests whose push waits for their prefill to complete (few, at any time)."""

    @abstractmethod
    def on_scheduled(
        self,
        request_id: str,
        prefill_completes: bool,
        block_ids: AnyBlockIds,
        prompt: PromptBinding | None = None,
    ) -> None:
        """A pending save was scheduled this step (``prompt``: its prompt's binding)."""

    @abstractmethod
    def on_finished(
        self,
        request_id: str,
        length_capped: bool,
        block_ids: AnyBlockIds,
        wall_now: float,
        now: float,
        params: TransferParams | None = None,
        prompt: PromptBinding | None = None,
    ) -> FinishDecision:
        """Decide whether the request's blocks outlive it (until the hand-off ends).

        ``params``: the request's transfer params (None when it takes no part in P/D).
        ``prompt``: the binding of the prompt its KV was computed for (READ signs it).
        """

    def _hold(self, request_id: str, transfer_id: str, now: float, token: str) -> None:
        """Keep the finished request's blocks under a lease until its transfer ends."""
        self._held[request_id] = transfer_id
        heapq.heappush(self._lease_heap, (self._reclaim_deadline(now), request_id))
        self._orders.holds.append(HoldOrder(request_id, transfer_id, token))

    def _returned_params(
        self,
        transfer_id: str,
        block_ids: AnyBlockIds,
        lease_expires_at: float,
        token: str | None = None,
    ) -> dict[str, Any]:
        """The ``kv_transfer_params`` handed back to the router for the decode engine."""
        return self._returned.for_transfer(transfer_id, block_ids, lease_expires_at, token)

    def on_connector_output(self, finished_sending: set[str] | None, now: float) -> set[str]:
        """Forget released requests; return held requests whose lease expired (to free now)."""
        for request_id in finished_sending or ():
            released = self._held.pop(request_id, None)
            if released is not None:
                self._forget_owner(released, request_id)
        expired: set[str] = set()
        heap = self._lease_heap
        while heap and heap[0][0] <= now:
            _, request_id = heapq.heappop(heap)
            tid = self._held.pop(request_id, None)
            if tid is None:
                continue  # released before its lease ran out
            self._forget_owner(tid, request_id)
            expired.add(request_id)
            self.expired_total += 1
            self._orders.drops.append(DropOrder(request_id, tid, DropReason.EXPIRED))
        return expired
