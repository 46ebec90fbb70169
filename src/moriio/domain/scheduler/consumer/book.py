"""Scheduler-side bookkeeping of a consumer (decode) engine.

Asynchronous loads (WRITE mode, and READ mode with ``load_mode`` async): the request waits in
``WAITING_FOR_REMOTE_KVS`` until its worker reports the load finished (the producer's
``write_done``, or the end of the reads). READ with ``load_mode`` layerwise: the request runs
in the step its reads are posted, and attention waits for them layer by layer.

Block ids come one list per KV-cache group (see :mod:`moriio.domain.kv.block_groups`).

READ orders carry what the worker verifies before it reads or releases a hand-off
(:class:`~moriio.domain.params.handoff_tags.HandoffCheck`); WRITE announcements carry the
request's prompt binding, which the producer checks before it pushes. Bindings are computed
by the caller (they need the engine's request) only for requests that load.
"""

from __future__ import annotations

from typing import NamedTuple

from moriio.domain.kv.block_groups import (
    NULL_BLOCK,
    AnyBlockIds,
    group_lists,
    group_sizes,
    num_positions,
    paired_window,
    window,
)
from moriio.domain.params.handoff_tags import HandoffCheck, PromptBinding
from moriio.domain.params.orders import (
    AbortWriteOrder,
    ExpectWriteOrder,
    ReadOrder,
    ReleaseOrder,
)
from moriio.domain.params.transfer_params import TransferParams
from moriio.domain.scheduler.pending_orders import PendingOrders
from moriio.domain.values.modes import LoadMode, TransferMode


class MatchResult(NamedTuple):
    num_tokens: int
    load_async: bool


class ConsumerBook(PendingOrders):
    """Consumer scheduler state for one engine."""

    def __init__(
        self,
        mode: TransferMode,
        block_size: int,
        load_mode: LoadMode = LoadMode.ASYNC,
        prefill_backoff: int = 0,
        null_positions: bool = True,
    ) -> None:
        """``prefill_backoff``: trailing prompt tokens the producer does not compute and this
        engine computes itself (1 with Mamba / linear-attention state: a state is loaded as
        it stood before the last token, which the decode then feeds). ``null_positions``:
        whether a block list may hold the null block (sliding-window, chunked or state
        groups; False when every group keeps every position)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if prefill_backoff < 0:
            raise ValueError(f"prefill_backoff must not be negative, got {prefill_backoff}")
        super().__init__()
        self._block_size = block_size
        self._backoff = prefill_backoff
        self._nulls = null_positions
        self._reads = mode is TransferMode.READ  # an enum's attributes are slow to read
        self._read_async = self._reads and load_mode is LoadMode.ASYNC
        self._local_hits: dict[str, int] = {}  # request id -> locally computed tokens
        self._awaiting_write: dict[str, str] = {}  # request id -> transfer id
        self._awaiting_read: set[str] = set()  # asynchronous reads not reported finished

    @property
    def num_awaiting_write(self) -> int:
        return len(self._awaiting_write)

    @property
    def num_awaiting_read(self) -> int:
        return len(self._awaiting_read)

    def match(
        self,
        request_id: str,
        params: TransferParams | None,
        num_prompt_tokens: int,
        num_computed_tokens: int,
    ) -> MatchResult:
        """Tokens loadable from the producer beyond ``num_computed_tokens``.

        Only remembers the local hit for :meth:`on_allocated`; otherwise side-effect free.
        """
        return MatchResult(
            *self.match_tokens(request_id, params, num_prompt_tokens, num_computed_tokens)
        )

    def match_tokens(
        self,
        request_id: str,
        params: TransferParams | None,
        num_prompt_tokens: int,
        num_computed_tokens: int,
    ) -> tuple[int, bool]:
        """:meth:`match` as the plain pair vLLM takes (no object built per request)."""
        if params is None or not params.do_remote_prefill or params.peer is None:
            return 0, False
        # Conditional expressions, not min() and max(): this runs once per request.
        backoff = self._backoff
        loadable = num_prompt_tokens - backoff if num_prompt_tokens > backoff else 0
        if self._reads:
            groups = params.remote_block_ids or ()
            positions = len(groups[0]) if len(groups) == 1 else num_positions(groups)
            if not positions:
                return 0, False
            available = positions * self._block_size
            available = available if available < loadable else loadable
            signature = params.signature
            if signature is not None and signature.num_tokens < available:
                available = signature.num_tokens  # the KV covers no more of the prompt
            if not self._read_async and available > num_prompt_tokens - 1:
                # A synchronous load must leave the last prompt token to compute (vLLM
                # recomputes it itself after an asynchronous one).
                available = num_prompt_tokens - 1
            count = available - num_computed_tokens if available > num_computed_tokens else 0
            self._local_hits[request_id] = num_computed_tokens
            return count, self._read_async and count > 0
        count = loadable - num_computed_tokens if loadable > num_computed_tokens else 0
        self._local_hits[request_id] = num_computed_tokens
        return count, count > 0

    def on_allocated(
        self,
        request_id: str,
        params: TransferParams | None,
        block_ids: AnyBlockIds,
        num_external_tokens: int,
        prompt: PromptBinding | None = None,
    ) -> bool:
        """Turn an allocation into worker orders. Returns True when the params were consumed
        (the caller then clears ``do_remote_prefill`` so the transfer happens once).

        ``prompt``: the request's binding (READ: under the signature's scheme, of as many
        tokens as it signed; WRITE: of the tokens it loads; None where it has none)."""
        if params is None or not params.do_remote_prefill or params.peer is None:
            return False
        local_hit = self._local_hits.pop(request_id, 0)
        if num_external_tokens <= 0:
            # Everything needed is cached locally: only free the producer's blocks.
            self._orders.releases.append(self._release(request_id, params, prompt))
            return True
        first = local_hit // self._block_size
        end = -(-(local_hit + num_external_tokens) // self._block_size)
        groups = group_lists(block_ids)
        if self._reads:
            lists = params.remote_block_ids or ((),)
            local, remote = paired_window(groups, lists, first, end, nulls=self._nulls)
            self._orders.reads.append(
                ReadOrder(  # positional: keywords cost a NamedTuple a slower call
                    request_id,
                    params.transfer_id,
                    local,
                    remote,
                    params.peer,
                    params.lease_expires_at,
                    params.token or "",
                    self._read_async,
                    handoff_check(params, prompt),
                    group_sizes(groups, lists, first, end),
                )
            )
            if self._read_async:
                self._awaiting_read.add(request_id)
        else:
            self._awaiting_write[request_id] = params.transfer_id
            local = window(groups, first, end, NULL_BLOCK)
            self._orders.expect_writes.append(
                ExpectWriteOrder(request_id, params.transfer_id, local, first, params.peer, prompt)
            )
        return True

    def on_finished(
        self, request_id: str, params: TransferParams | None, prompt: PromptBinding | None = None
    ) -> bool:
        """The request ended. Returns True when its blocks must outlive it (a load in flight:
        vLLM frees them once the worker reports the load finished). ``prompt``: as for
        :meth:`on_allocated`, for params never consumed (a READ release is verified)."""
        self._local_hits.pop(request_id, None)
        if request_id in self._awaiting_read:
            # The read ends by its deadline on its own (and releases the producer then).
            return True
        tid = self._awaiting_write.get(request_id)
        if tid is not None:
            self._orders.abort_writes.append(AbortWriteOrder(request_id, tid))
            return True
        if params is not None and params.do_remote_prefill and params.peer is not None:
            # Never loaded (aborted while waiting): the producer still holds blocks for us.
            self._orders.releases.append(self._release(request_id, params, prompt))
        return False

    def _release(
        self, request_id: str, params: TransferParams, prompt: PromptBinding | None
    ) -> ReleaseOrder:
        assert params.peer is not None
        check = handoff_check(params, prompt) if self._reads else None
        return ReleaseOrder(request_id, params.transfer_id, params.peer, params.token or "", check)

    def on_connector_output(self, finished_recving: set[str] | None) -> None:
        """Requests whose loads ended (successfully or not) no longer await anything."""
        for request_id in finished_recving or ():
            self._awaiting_write.pop(request_id, None)
            self._awaiting_read.discard(request_id)


def handoff_check(params: TransferParams, prompt: PromptBinding | None) -> HandoffCheck | None:
    """What the worker verifies before it reads or releases the hand-off ``params`` name
    (None: they carry no signature, and nothing is read or released for them)."""
    signature, peer = params.signature, params.peer
    if signature is None or peer is None:
        return None
    if prompt is None:
        prompt = PromptBinding(signature.scheme, signature.num_tokens, b"")
    groups = params.remote_block_ids or ()
    return HandoffCheck(params.transfer_id, peer.engine_id or "", signature, groups, prompt)
