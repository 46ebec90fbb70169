"""WRITE producer book: orders each push in the step that completes its prefill."""

from __future__ import annotations

from collections.abc import Iterable

from moriio.domain.scheduler.producer_book import LocalEndpoint, ProducerBook
from moriio.domain.wire.orders import DropOrder, DropReason, SaveOrder
from moriio.domain.wire.transfer_params import TransferParams


class WriteProducerBook(ProducerBook):
    """Holds a request's blocks from its finish until its pushed writes ended."""

    def __init__(
        self, endpoint: LocalEndpoint, lease_seconds: float, skew_seconds: float = 0.0
    ) -> None:
        super().__init__(endpoint, lease_seconds, skew_seconds)
        self._pending_saves: dict[str, TransferParams] = {}  # prefill not yet complete
        self._saves_issued: set[str] = set()  # push ordered: blocks must be held

    def on_allocated(self, request_id: str, params: TransferParams | None) -> bool:
        fresh = params is not None and params.do_remote_decode and request_id not in self._tracked
        if not super().on_allocated(request_id, params):
            return False
        if fresh:
            assert params is not None
            self._pending_saves[request_id] = params
        return True

    def is_pending_save(self, request_id: str) -> bool:
        return request_id in self._pending_saves

    def pending_saves(self) -> list[str]:
        return list(self._pending_saves)

    def on_scheduled(
        self, request_id: str, prefill_completes: bool, block_ids: Iterable[int]
    ) -> None:
        """Order the push in the step whose forward completes the prefill."""
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

    def _finished_untracked(self, request_id: str, params: TransferParams | None) -> None:
        self._pending_saves.pop(request_id, None)
        if params is not None and params.do_remote_decode:
            # The consumer may already have announced its blocks: the worker refuses them.
            drop = DropOrder(request_id, params.transfer_id, DropReason.CANCELLED)
            self._orders.drops.append(drop)

    def _handed_off(
        self, request_id: str, transfer_id: str, *, length_capped: bool, blocks: list[int]
    ) -> bool:
        self._pending_saves.pop(request_id, None)
        if request_id in self._saves_issued:
            self._saves_issued.discard(request_id)
            return True
        self._orders.drops.append(DropOrder(request_id, transfer_id, DropReason.CANCELLED))
        return False

    def _mint_token(self) -> str:
        return ""  # the pusher frees the blocks on its own writes' completion
