"""Scheduler-role half of the connector: translates vLLM objects for the domain books.

Block ids go to the books one list per transferred KV-cache group (vLLM's hybrid manager
gives several; :mod:`moriio.domain.kv.block_groups` says how they pair).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from vllm.v1.request import RequestStatus

from moriio.container import SchedulerContainer
from moriio.domain.params.handoff_tags import PromptBinding
from moriio.domain.params.orders import StepOrders
from moriio.domain.params.transfer_params import (
    TransferParams,
    TransferParamsError,
    parse_transfer_params,
)
from moriio.domain.scheduler.producer.book import ProducerBook
from moriio.domain.values.modes import TransferMode
from moriio.log import get_logger
from moriio.vllm_plugin.metadata import MoriioConnectorMetadata
from moriio.vllm_plugin.prompt_binding import PromptBinder
from moriio.vllm_plugin.tracing import RequestTrace

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = get_logger("moriio.scheduler")
# Marks a request whose params were never parsed (typed as params: no cast() on hot paths).
_UNSEEN = TransferParams("", False, False, None, None)
_TRUNCATED = "_moriio_prefill_truncated"  # set in a request's params once it was shortened
_LENGTH_CAPPED = RequestStatus.FINISHED_LENGTH_CAPPED  # read once: enum attributes are slow


class SchedulerSide:
    """One per engine (EngineCore process). Producer and consumer books as the role allows."""

    def __init__(
        self,
        parts: SchedulerContainer,
        *,
        trace: RequestTrace | None = None,
        transfer_groups: tuple[int, ...] | None = None,
        prompts: PromptBinder | None = None,
    ) -> None:
        """``parts``: the books, clock and KV-cache shape, resolved here once.
        ``trace``: records each request's timeline (None: nothing is recorded).
        ``transfer_groups``: the KV-cache groups moved (None: all of them).
        ``prompts``: binds requests' prompts to hand-offs (default: vLLM's default prefix
        hash, by the block size)."""
        role = parts.role()
        self._clock = parts.clock()
        self._now = self._clock.now  # bound once: read on every finish
        self._trace = trace
        self._transfer_groups = transfer_groups
        self._backoff = parts.prefill_backoff()
        self.producer = parts.producer()
        self.consumer = parts.consumer()
        self._save_candidates: dict[str, Request] = {}
        self._kv_cache_manager: KVCacheManager | None = None
        # Parsed once per request, kept until request_finished (vLLM calls it exactly once).
        self._params: dict[str, TransferParams | None] = {}
        mode = parts.settings().mode
        self._producer_peer = role.is_producer and mode is TransferMode.WRITE
        self._reads = mode is TransferMode.READ
        self._prompts = prompts or PromptBinder("sha256", parts.block_size())
        # The key hand-offs are signed with: every step's metadata carries it to the workers,
        # which give it to decodes in handshakes (never to a client).
        self._handoff_key = None if self.producer is None else self.producer.handoff_key
        # Whether update_state_after_alloc has anything to do (a READ producer does not).
        self._acts_on_allocation = self.consumer is not None or (
            self.producer is not None and self.producer.claims_at_allocation
        )
        self.rejected_params = 0

    def _typed(self, request: Request) -> TransferParams | None:
        """The request's params, parsed on first use and kept until it finishes."""
        params = self._params.get(request.request_id, _UNSEEN)
        return self._first_parse(request) if params is _UNSEEN else params

    def _first_parse(self, request: Request) -> TransferParams | None:
        """Parse and keep the params of a request seen for the first time."""
        rid = request.request_id
        try:
            params = parse_transfer_params(
                request.kv_transfer_params,
                rid,
                producer_peer=self._producer_peer,
                consumer=self.consumer is not None,
            )
        except TransferParamsError as exc:
            self._rejected(rid, exc)
            params = None
        self._params[rid] = params
        if params is not None and self._trace is not None:
            self._trace.arrived(rid, params)
        return params

    def _parse(self, request: Request) -> TransferParams | None:
        try:
            return parse_transfer_params(
                request.kv_transfer_params,
                request.request_id,
                producer_peer=self._producer_peer,
                consumer=self.consumer is not None,
            )
        except TransferParamsError as exc:
            self._rejected(request.request_id, exc)
            return None

    def _rejected(self, request_id: str, exc: TransferParamsError) -> None:
        # A client sent bad params: run the request without a transfer, never crash the
        # engine. A waiting producer reclaims its blocks when its lease ends.
        self.rejected_params += 1
        log.warning("ignoring invalid kv_transfer_params", request_id=request_id, reason=str(exc))

    def bind_kv_cache_manager(self, manager: KVCacheManager) -> None:
        self._kv_cache_manager = manager

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if self.consumer is None:
            if self._trace is not None:
                self._typed(request)  # records its arrival
            return 0, False
        params = self._params.get(request.request_id, _UNSEEN)
        if params is _UNSEEN:
            params = self._first_parse(request)
        if params is None or not params.do_remote_prefill:
            return 0, False
        return self.consumer.match_tokens(
            request.request_id, params, request.num_prompt_tokens, num_computed_tokens
        )

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if not self._acts_on_allocation:
            return
        raw = request.kv_transfer_params
        params = self._params.get(request.request_id, _UNSEEN)
        if params is _UNSEEN:
            params = self._first_parse(request)
        if params is None:
            return
        if params.do_remote_decode and self.producer is not None:
            if not self.producer.on_allocated(
                request.request_id, params, lambda owner: self._same_prompt(owner, request)
            ):
                # Another live request claims this transfer id: no hand-off for this one (its
                # blocks are freed when it finishes, no params go back, the other is untouched).
                self._refuse_duplicate(request.request_id, params.transfer_id)
                params = params._replace(do_remote_decode=False)
                self._params[request.request_id] = params
            elif self.producer.is_pending_save(request.request_id):
                self._save_candidates[request.request_id] = request
        if params.do_remote_prefill and self.consumer is not None and raw is not None:
            block_ids = blocks.get_block_ids() if num_external_tokens > 0 else ()
            if self._transfer_groups is not None and block_ids:
                block_ids = self._moved(block_ids)
            prompt = self._consumer_binding(request, params, num_external_tokens)
            if self.consumer.on_allocated(
                request.request_id, params, block_ids, num_external_tokens, prompt
            ):
                raw["do_remote_prefill"] = False  # one transfer per request
                # Nothing is left to do for the request unless it also hands off its KV.
                self._params[request.request_id] = (
                    params._replace(do_remote_prefill=False) if params.do_remote_decode else None
                )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> MoriioConnectorMetadata:
        if self._trace is not None:
            self._trace.events(
                (new.req_id for new in scheduler_output.scheduled_new_reqs), "scheduled"
            )
        # A book's taken orders are its own no longer: the step ships them as they are.
        producer, consumer = self.producer, self.consumer
        if producer is not None:
            self._order_saves(producer, scheduler_output)
            orders = producer.take_orders()
            if consumer is not None:
                _merge(orders, consumer.take_orders())
        else:
            orders = consumer.take_orders() if consumer is not None else StepOrders()
        computes = scheduler_output.total_num_scheduled_tokens > 0
        return MoriioConnectorMetadata(orders, computes=computes, handoff_key=self._handoff_key)

    def on_new_request(self, request: Request) -> None:
        """A prefill of a model with recurrent state stops ``prefill_backoff`` tokens short
        (and samples one token, which the router discards): its decode loads the state as
        it stood before the last prompt token and computes that token itself."""
        if not self._backoff or self.producer is None or request.num_prompt_tokens <= self._backoff:
            return
        params = self._typed(request)
        if params is None or not params.do_remote_decode or request.prompt_token_ids is None:
            return
        raw = request.kv_transfer_params
        if raw is None or raw.get(_TRUNCATED) or request.get_skip_reading_prefix_cache():
            return
        del request.prompt_token_ids[-self._backoff :]
        del request._all_token_ids[-self._backoff :]
        request.num_prompt_tokens -= self._backoff
        request.max_tokens = 1
        raw[_TRUNCATED] = True

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """The single-group hook (vLLM without its hybrid manager)."""
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        typed = self._params.pop(rid, _UNSEEN)
        if typed is _UNSEEN:
            typed = self._parse(request)
        if self._save_candidates:
            self._save_candidates.pop(rid, None)
        if self._trace is not None:
            self._trace.event(rid, "finished", last=self.producer is None)
        producer = self.producer
        if typed is not None and typed.do_remote_decode and producer is not None:
            length_capped = request.status is _LENGTH_CAPPED
            prompt = None
            if length_capped and self._handoff_key is not None:  # the KV it signs for
                prompt = self._prompts.bind(request, request.num_prompt_tokens)
            decision = producer.on_finished(  # positional: this runs for every prefill
                rid,
                length_capped,
                block_ids if self._transfer_groups is None else self._moved(block_ids),
                time.time(),
                self._now(),
                typed,
                prompt,
            )
            returned = decision.params
            if returned is not None and returned["transfer_id"] != typed.transfer_id:
                log.info(
                    "transfer_id held by an earlier attempt: handed off under its own",
                    request_id=rid,
                    transfer_id=typed.transfer_id,
                    handed_off_as=returned["transfer_id"],
                )
            return decision.delay_free, returned
        if self.consumer is not None:
            # Also when the params were consumed (``do_remote_prefill`` cleared): a request
            # aborted while it waits for pushed KV must still tell its producer.
            prompt = None
            if typed is not None and typed.do_remote_prefill and typed.signature is not None:
                prompt = self._consumer_binding(request, typed, 0)  # a release to verify
            return self.consumer.on_finished(rid, typed, prompt), None
        return False, None

    def _consumer_binding(
        self, request: Request, params: TransferParams, num_external_tokens: int
    ) -> PromptBinding | None:
        """The request's prompt binding a load (or release) needs: READ, under the scheme and
        of the length the producer signed; WRITE, of the tokens it loads."""
        if self._reads:
            signature = params.signature
            if signature is None:
                return None  # nothing to verify: the worker refuses it unsigned
            return self._prompts.bind_as(request, signature.num_tokens, signature.scheme)
        if num_external_tokens <= 0:
            return None
        return self._prompts.bind(request, request.num_prompt_tokens - self._backoff)

    def _same_prompt(self, owner: str, request: Request) -> bool:
        """Whether ``request`` retries ``owner`` (waiting for its push): the same prompt."""
        earlier = self._save_candidates.get(owner)
        return earlier is not None and earlier.prompt_token_ids == request.prompt_token_ids

    def _refuse_duplicate(self, request_id: str, transfer_id: str) -> None:
        self.rejected_params += 1
        log.warning(
            "ignoring do_remote_decode: transfer_id already in use",
            request_id=request_id,
            transfer_id=transfer_id,
        )

    def set_registration_generation(self, generation: int) -> None:
        """The generation the workers' KV memory is registered under (a READ producer names
        it in every hand-off, see :mod:`moriio.domain.worker.generations`)."""
        if self.producer is not None:
            self.producer.set_registration_generation(generation)

    def has_pending_orders(self) -> bool:
        """Orders not shipped to the workers yet (e.g. reclaimed hand-offs of an idle engine)."""
        return (self.producer is not None and self.producer.has_orders) or (
            self.consumer is not None and self.consumer.has_orders
        )

    def update_connector_output(self, output: KVConnectorOutput) -> int:
        """Apply the workers' report; returns how many expired hand-offs were reclaimed."""
        if self.consumer is not None:
            self.consumer.on_connector_output(output.finished_recving)
        if self._trace is not None:
            self._trace.events(output.finished_recving, "ready")
            self._trace.events(output.finished_sending, "freed", last=True)
        if self.producer is None:
            return 0
        expired = self.producer.on_connector_output(output.finished_sending, self._clock.now())
        if expired:
            log.warning("reclaimed blocks of expired hand-offs", requests=len(expired))
            output.finished_sending = set(output.finished_sending or ()) | expired
        return len(expired)

    def _order_saves(self, producer: ProducerBook, scheduler_output: SchedulerOutput) -> None:
        """Order the push of every pending save whose prefill completes in this step.

        A new request's block ids come with the scheduler output (all of its blocks); only a
        prefill completing over several steps asks the KV cache manager.
        """
        candidates = self._save_candidates
        if not candidates:
            return
        scheduled = scheduler_output.num_scheduled_tokens
        prompts = self._prompts
        for new in scheduler_output.scheduled_new_reqs:
            request = candidates.get(new.req_id)
            if request is not None and _completes(request, scheduled.get(new.req_id)):
                prompt = prompts.bind(request, request.num_prompt_tokens)
                producer.on_scheduled(new.req_id, True, self._moved(new.block_ids), prompt)
                del candidates[new.req_id]
        for request_id in producer.pending_saves():
            request = candidates.get(request_id)
            if request is not None and _completes(request, scheduled.get(request_id)):
                prompt = prompts.bind(request, request.num_prompt_tokens)
                producer.on_scheduled(request_id, True, self._block_ids(request_id), prompt)
                del candidates[request_id]

    def _block_ids(self, request_id: str) -> tuple[list[int], ...]:
        if self._kv_cache_manager is None:
            raise RuntimeError("the KV cache manager was never bound to the connector")
        return self._moved(self._kv_cache_manager.get_block_ids(request_id))

    def _moved(self, block_ids: tuple[list[int], ...]) -> tuple[list[int], ...]:
        """The lists of the transferred groups, in group order."""
        groups = self._transfer_groups
        return block_ids if groups is None else tuple(block_ids[i] for i in groups)


def _completes(request: Request, num_new: int | None) -> bool:
    """Whether the tokens scheduled for ``request`` in this step complete its prompt."""
    if not num_new:
        return False
    return request.num_computed_tokens + num_new >= request.num_prompt_tokens


def _merge(into: StepOrders, other: StepOrders) -> None:
    into.reads += other.reads
    into.releases += other.releases
    into.expect_writes += other.expect_writes
    into.abort_writes += other.abort_writes
    into.saves += other.saves
    into.holds += other.holds
    into.drops += other.drops
