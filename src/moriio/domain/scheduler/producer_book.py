"""Scheduler-side bookkeeping of a producer (prefill) engine.

Tracks the requests whose KV will be handed to a decode engine, decides when their blocks
may be freed, and emits per-step orders for the workers. All costs are per changed request:
nothing scans every live transfer on every step.
"""

from __future__ import annotations

import heapq
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from moriio.domain.wire.modes import TransferMode
from moriio.domain.wire.orders import (
    DropOrder,
    DropReason,
    HoldOrder,
    SaveOrder,
    StepOrders,
)
from moriio.domain.wire.transfer_params import TransferParams, with_token


@dataclass(frozen=True, slots=True)
class LocalEndpoint:
    """How decode engines reach this engine (advertised in the returned params).

    ``instance_id``: this engine's incarnation (it changes on every restart), so that a
    consumer never reads blocks of a dead engine from the process that replaced it.
    """

    engine_id: str
    host: str
    handshake_port: int
    notify_port: int
    tp_size: int
    dp_size: int
    dp_rank: int
    instance_id: str


class FinishDecision(NamedTuple):
    """What ``request_finished`` returns to vLLM."""

    delay_free: bool
    params: dict[str, Any] | None


class ProducerBook:
    """Producer scheduler state for one engine."""

    def __init__(
        self,
        mode: TransferMode,
        endpoint: LocalEndpoint,
        lease_seconds: float,
        skew_seconds: float = 0.0,
    ) -> None:
        """``skew_seconds``: the clock-skew allowance. The lease handed out ends
        ``lease_seconds`` after the finish on this host's wall clock; the blocks are
        reclaimed only ``skew_seconds`` later, so a consumer whose clock is behind ours by up
        to the allowance never reads them after their reuse."""
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {lease_seconds}")
        if not 0 <= skew_seconds < float("inf"):
            raise ValueError(f"skew_seconds must be >= 0 and finite, got {skew_seconds}")
        self._mode = mode
        self._endpoint = endpoint
        self._lease_seconds = lease_seconds
        self._skew_seconds = skew_seconds
        self._tracked: dict[str, TransferParams] = {}
        self._pending_saves: dict[str, TransferParams] = {}  # WRITE: prefill not yet complete
        self._saves_issued: set[str] = set()  # WRITE: push ordered, blocks must be held
        self._held: dict[str, str] = {}  # request id -> transfer id, blocks held for hand-off
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

    def on_allocated(self, request_id: str, params: TransferParams | None) -> None:
        """A request got blocks; remember it if its KV goes to a decode engine."""
        if params is not None and params.do_remote_decode and request_id not in self._tracked:
            self._tracked[request_id] = params
            if self._mode is TransferMode.WRITE:
                self._pending_saves[request_id] = params

    def is_pending_save(self, request_id: str) -> bool:
        return request_id in self._pending_saves

    def pending_saves(self) -> list[str]:
        """WRITE mode: requests whose prefill has not completed yet (few, at any time)."""
        return list(self._pending_saves)

    def on_scheduled(
        self, request_id: str, prefill_completes: bool, block_ids: Iterable[int]
    ) -> None:
        """WRITE mode: order the push in the step whose forward completes the prefill."""
        if not prefill_completes:
            return
        params = self._pending_saves.pop(request_id, None)
        if params is None:
            return
        self._saves_issued.add(request_id)
        self._orders.saves.append(
            SaveOrder(
                request_id=request_id,
                transfer_id=params.transfer_id,
                block_ids=tuple(block_ids),
                peer=params.peer,
            )
        )

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

        ``params``: the request's transfer params, for a request that finishes before it was
        ever allocated (aborted while queued).
        """
        tracked = self._tracked.pop(request_id, None)
        self._pending_saves.pop(request_id, None)
        if tracked is None:
            if params is not None and params.do_remote_decode and self._mode is TransferMode.WRITE:
                # The consumer may already have announced its blocks: the worker refuses them.
                drop = DropOrder(request_id, params.transfer_id, DropReason.CANCELLED)
                self._orders.drops.append(drop)
            return FinishDecision(False, None)
        tid = tracked.transfer_id
        if self._mode is TransferMode.WRITE:
            handed_off = request_id in self._saves_issued
            self._saves_issued.discard(request_id)
        else:
            handed_off = length_capped and bool(block_ids)
        if not handed_off:
            if self._mode is TransferMode.WRITE:
                self._orders.drops.append(DropOrder(request_id, tid, DropReason.CANCELLED))
            return FinishDecision(False, None)
        self._held[request_id] = tid
        reclaim_at = now + self._lease_seconds + self._skew_seconds
        heapq.heappush(self._lease_heap, (reclaim_at, request_id))
        # READ: the capability a consumer must show to free the blocks (WRITE frees them
        # on its own writes' completion).
        token = secrets.token_hex(16) if self._mode is TransferMode.READ else ""
        self._orders.holds.append(HoldOrder(request_id, tid, token))
        lease_expires_at = wall_now + self._lease_seconds
        returned = self._returned_params(tid, block_ids, lease_expires_at)
        if token:
            returned["remote_engine_id"] = with_token(self._endpoint.engine_id, token)
        return FinishDecision(True, returned)

    def on_connector_output(self, finished_sending: set[str] | None, now: float) -> set[str]:
        """Forget released requests; return held requests whose lease expired (to free now)."""
        for request_id in finished_sending or ():
            self._held.pop(request_id, None)
        expired: set[str] = set()
        heap = self._lease_heap
        while heap and heap[0][0] <= now:
            _, request_id = heapq.heappop(heap)
            tid = self._held.pop(request_id, None)
            if tid is None:
                continue  # released before its lease ran out
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

    def _returned_params(
        self, transfer_id: str, block_ids: list[int], lease_expires_at: float
    ) -> dict[str, Any]:
        params = dict(self._params_template)
        params["transfer_id"] = transfer_id
        params["remote_block_ids"] = [list(block_ids)]
        params["lease_expires_at"] = lease_expires_at
        return params
