"""READ producer book: a finished request's blocks are held until its consumer read them."""

from __future__ import annotations

from collections.abc import Callable

from moriio.domain.kv.block_groups import AnyBlockIds, group_lists
from moriio.domain.params.handoff_tags import HandoffSigner, PromptBinding, new_handoff_key
from moriio.domain.params.transfer_params import MAX_TRANSFER_ID_LEN, TransferParams
from moriio.domain.scheduler.producer.book import (
    NO_HAND_OFF,
    FinishDecision,
    LocalEndpoint,
    ProducerBook,
)
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.capability import new_token

RETRY_SUFFIX_LEN = 17  # "~" and 16 hex digits


class ReadProducerBook(ProducerBook):
    """Hands off a length-capped prefill's blocks under a lease and a release capability,
    signed with this engine's key (drawn here, at start-up: a restart draws another).

    Nothing happens at allocation: a request claims its transfer id when it finishes, the
    only moment its blocks are handed off. A request finishing under an id whose blocks are
    still held (a router retried the prefill, as llm-d does on a 5xx, and the first attempt
    finished too) is handed off under an id of its own, returned in its params: a decode only
    ever learns a READ transfer's id from the params its own prefill returned, so each
    reads the blocks of the attempt it was told about, and an orphaned attempt's blocks are
    freed at its lease. A request whose prompt has no binding is not handed off: no decode
    could prove it loads the KV for the same prompt.
    """

    claims_at_allocation = False

    def __init__(
        self, endpoint: LocalEndpoint, policy: TransferPolicy, handoff_key: bytes | None = None
    ) -> None:
        super().__init__(endpoint, policy)
        self.handoff_key: bytes = handoff_key or new_handoff_key()
        self._signer = HandoffSigner(self.handoff_key, endpoint.engine_id, endpoint.instance_id)

    def on_allocated(
        self,
        request_id: str,
        params: TransferParams | None,
        is_retry_of: Callable[[str], bool] | None = None,
    ) -> bool:
        return True  # the claim is made in on_finished

    def is_pending_save(self, request_id: str) -> bool:
        return False  # consumers pull: nothing is pushed

    def pending_saves(self) -> list[str]:
        return []

    def on_scheduled(
        self,
        request_id: str,
        prefill_completes: bool,
        block_ids: AnyBlockIds,
        prompt: PromptBinding | None = None,
    ) -> None:
        """Consumers pull: scheduling orders nothing."""

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
        if params is None or not params.do_remote_decode or not length_capped:
            return NO_HAND_OFF
        groups = group_lists(block_ids)
        if not any(groups) or prompt is None or not prompt.value:  # no block, or no binding
            return NO_HAND_OFF
        transfer_id = params.transfer_id
        if not self._claim(transfer_id, request_id):
            transfer_id = retry_transfer_id(transfer_id)
            self._claim(transfer_id, request_id)
        lease_ms = int(self._lease_end(wall_now) * 1000)  # signed as it travels: whole ms
        try:
            # The check tag is the capability a consumer must show to free the blocks.
            token, signed = self._signer.sign(transfer_id, lease_ms, groups, prompt)
        except (OverflowError, TypeError):  # a block id no engine hands out
            self._forget_owner(transfer_id, request_id)
            return NO_HAND_OFF
        self._hold(request_id, transfer_id, now, token)
        returned = self._returned.for_transfer(transfer_id, groups, lease_ms / 1000, signed)
        return FinishDecision(True, returned)


def retry_transfer_id(transfer_id: str) -> str:
    """A fresh id for another hand-off under ``transfer_id`` (random: never guessed)."""
    stem = transfer_id[: MAX_TRANSFER_ID_LEN - RETRY_SUFFIX_LEN]
    return f"{stem}~{new_token()[:16]}"
