"""Scheduler-side bookkeeping of a producer (prefill) engine: what both modes share.

Tracks the requests whose KV will be handed to a decode engine, decides when their blocks
may be freed, and emits per-step orders for the workers. All costs are per changed request:
nothing scans every live transfer on every step. The mode's book (:mod:`read_book`,
:mod:`write_book`) is chosen once, where the scheduler side is built.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from moriio.domain.wire.orders import DropOrder, DropReason, HoldOrder, StepOrders
from moriio.domain.wire.transfer_params import TransferParams


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


class ProducerBook(ABC):
    """Producer scheduler state for one engine.

    ``claims_at_allocation``: whether :meth:`on_allocated` does anything (the scheduler side
    skips the call, and the parsing it needs, when it does not).
    """

    claims_at_allocation: ClassVar[bool]

    def __init__(
        self, endpoint: LocalEndpoint, lease_seconds: float, skew_seconds: float = 0.0
    ) -> None:
        """``skew_seconds``: the clock-skew allowance. The lease handed out ends
        ``lease_seconds`` after the finish on this host's wall clock; the blocks are
        reclaimed only ``skew_seconds`` later, so a consumer whose clock is behind ours by up
        to the allowance never reads them after their reuse."""
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {lease_seconds}")
        if not 0 <= skew_seconds < float("inf"):
            raise ValueError(f"skew_seconds must be >= 0 and finite, got {skew_seconds}")
        self._endpoint = endpoint
        self._lease_seconds = lease_seconds
        self._reclaim_after = lease_seconds + skew_seconds
        self._tracked: dict[str, TransferParams] = {}
        self._held: dict[str, str] = {}  # request id -> transfer id, blocks held for hand-off
        self._owner_of: dict[str, str] = {}  # transfer id -> the request tracked or held for it
        self._lease_heap: list[tuple[float, str]] = []
        self._orders = StepOrders()
        self.expired_total = 0
        ep = endpoint
        # What every returned ``kv_transfer_params`` shares (the router contract's keys).
        self._params_template: dict[str, Any] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": ep.engine_id,
            "remote_host": ep.host,
            "remote_handshake_port": ep.handshake_port,
            "remote_notify_port": ep.notify_port,
            "remote_dp_size": ep.dp_size,
            "remote_dp_rank": ep.dp_rank,
            # llm-d pins the decode leg to the rank the prefill returns, as vLLM's in-tree
            # connector returns it.
            "remote_dp_rank_override": True,
            "remote_dp_size_local": ep.dp_size_local,
            "tp_size": ep.tp_size,
            "remote_tp_size": ep.tp_size,
            "remote_instance_id": ep.instance_id,
        }

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
        self, request_id: str, prefill_completes: bool, block_ids: Iterable[int]
    ) -> None:
        """A pending save was scheduled this step."""

    @abstractmethod
    def on_finished(
        self,
        request_id: str,
        *,
        length_capped: bool,
        block_ids: list[int],
        wall_now: float,
        now: float,
        params: TransferParams | None = None,
    ) -> FinishDecision:
        """Decide whether the request's blocks outlive it (until the hand-off ends).

        ``params``: the request's transfer params (None when it takes no part in P/D).
        """

    def _hold(self, request_id: str, transfer_id: str, now: float, token: str) -> None:
        """Keep the finished request's blocks under a lease until its transfer ends."""
        self._held[request_id] = transfer_id
        heapq.heappush(self._lease_heap, (now + self._reclaim_after, request_id))
        self._orders.holds.append(HoldOrder(request_id, transfer_id, token))

    def _returned_params(
        self, transfer_id: str, block_ids: list[int], wall_now: float
    ) -> dict[str, Any]:
        """The ``kv_transfer_params`` handed back to the router for the decode engine."""
        params = self._params_template.copy()
        params["transfer_id"] = transfer_id
        params["remote_block_ids"] = [list(block_ids)]
        params["lease_expires_at"] = wall_now + self._lease_seconds
        return params

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

    @property
    def has_orders(self) -> bool:
        """Whether orders wait for the next :meth:`take_orders`."""
        return not self._orders.is_empty()

    def take_orders(self) -> StepOrders:
        """This step's orders; resets them."""
        orders, self._orders = self._orders, StepOrders()
        return orders
