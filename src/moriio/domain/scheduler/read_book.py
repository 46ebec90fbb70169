"""READ producer book: a finished request's blocks are held until its consumer read them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from moriio.domain.scheduler.producer_book import ProducerBook
from moriio.domain.wire.capability import new_token
from moriio.domain.wire.transfer_params import TransferParams, with_token


class ReadProducerBook(ProducerBook):
    """Hands off a length-capped prefill's blocks under a lease and a release capability."""

    def is_pending_save(self, request_id: str) -> bool:
        return False  # consumers pull: nothing is pushed

    def pending_saves(self) -> list[str]:
        return []

    def on_scheduled(
        self, request_id: str, prefill_completes: bool, block_ids: Iterable[int]
    ) -> None:
        """Consumers pull: scheduling orders nothing."""

    def _finished_untracked(self, request_id: str, params: TransferParams | None) -> None:
        """Nothing was handed off, nothing to tell the workers."""

    def _handed_off(
        self, request_id: str, transfer_id: str, *, length_capped: bool, blocks: list[int]
    ) -> bool:
        return length_capped and bool(blocks)

    def _mint_token(self) -> str:
        # The capability a consumer must show to free the blocks.
        return new_token()

    def _returned_params(
        self, transfer_id: str, block_ids: list[int], wall_now: float, token: str
    ) -> dict[str, Any]:
        returned = super()._returned_params(transfer_id, block_ids, wall_now, token)
        returned["remote_engine_id"] = with_token(self._endpoint.engine_id, token)
        return returned
