"""WRITE producer book: orders each push in the step that completes its prefill."""

from __future__ import annotations

from collections.abc import Callable

from moriio.domain.kv.block_groups import AnyBlockIds, as_groups
from moriio.domain.params.handoff_tags import PromptBinding
from moriio.domain.params.orders import DropOrder, DropReason, SaveOrder
from moriio.domain.params.transfer_params import TransferParams
from moriio.domain.scheduler.producer.book import (
    NO_HAND_OFF,
    FinishDecision,
    LocalEndpoint,
    ProducerBook,
)
from moriio.domain.timing.policy import TransferPolicy


class WriteProducerBook(ProducerBook):
    """Holds a request's blocks from its finish until its pushed writes ended.

    A request claims its transfer id when it gets blocks: its push is ordered before it
    finishes. A retry (the same prompt under the same id, as llm-d sends after a 5xx) takes
    the id over from an attempt whose push is not ordered yet: the router waits on the
    newest attempt, and the older one finishes without a hand-off and without cancelling
    the transfer. Once the older push is ordered it serves the decode and a retry is refused.
    """

    claims_at_allocation = True

    def __init__(self, endpoint: LocalEndpoint, policy: TransferPolicy) -> None:
        super().__init__(endpoint, policy)
        self._pending_saves: dict[str, TransferParams] = {}  # prefill not yet complete
        self._saves_issued: set[str] = set()  # push ordered: blocks must be held
        self._superseded: set[str] = set()  # their transfer id was taken over by a retry

    def on_allocated(
        self,
        request_id: str,
        params: TransferParams | None,
        is_retry_of: Callable[[str], bool] | None = None,
    ) -> bool:
        if params is None or not params.do_remote_decode or request_id in self._tracked:
            return True
        if request_id in self._superseded:  # allocated again after a preemption
            return True  # it still ends without a hand-off, in on_finished
        owner = self._owner_of.get(params.transfer_id, request_id)
        if owner != request_id:
            if owner not in self._pending_saves or is_retry_of is None or not is_retry_of(owner):
                return False
            self._supersede(owner)
        self._claim(params.transfer_id, request_id)
        self._tracked[request_id] = params
        self._pending_saves[request_id] = params
        return True

    def _supersede(self, request_id: str) -> None:
        params = self._tracked.pop(request_id)
        del self._pending_saves[request_id]
        self._forget_owner(params.transfer_id, request_id)
        self._superseded.add(request_id)

    def is_pending_save(self, request_id: str) -> bool:
        return request_id in self._pending_saves

    def pending_saves(self) -> list[str]:
        return list(self._pending_saves)

    def on_scheduled(
        self,
        request_id: str,
        prefill_completes: bool,
        block_ids: AnyBlockIds,
        prompt: PromptBinding | None = None,
    ) -> None:
        """Order the push in the step whose forward completes the prefill; ``prompt``: the
        binding the consumer's announcement must carry (None: no announcement is pushed to)."""
        if not prefill_completes:
            return
        params = self._pending_saves.pop(request_id, None)
        if params is None:
            return
        self._saves_issued.add(request_id)
        self._orders.saves.append(  # positional: keywords cost a NamedTuple a slower call
            SaveOrder(request_id, params.transfer_id, as_groups(block_ids), params.peer, prompt)
        )

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
        self._pending_saves.pop(request_id, None)
        tracked = self._tracked.pop(request_id, None)
        if request_id in self._superseded:
            self._superseded.discard(request_id)
            return NO_HAND_OFF  # its retry owns the transfer now
        if tracked is None:
            if params is not None and params.do_remote_decode:
                # Aborted while queued; the consumer may already have announced its blocks:
                # the worker refuses them.
                drop = DropOrder(request_id, params.transfer_id, DropReason.CANCELLED)
                self._orders.drops.append(drop)
            return NO_HAND_OFF
        transfer_id = tracked.transfer_id
        if request_id not in self._saves_issued:
            self._forget_owner(transfer_id, request_id)
            self._orders.drops.append(DropOrder(request_id, transfer_id, DropReason.CANCELLED))
            return NO_HAND_OFF
        self._saves_issued.discard(request_id)
        self._hold(request_id, transfer_id, now, "")  # the pusher frees them on completion
        lease = self._lease_end(wall_now)
        return FinishDecision(True, self._returned_params(transfer_id, block_ids, lease))
