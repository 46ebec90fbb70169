"""The two simulated engines: vLLM's scheduler contract, emulated around the domain books.

Each node owns a block pool, its KV memory, its scheduler book and one worker. It steps like a
vLLM engine, and only while it has requests: schedule (allocate blocks, call the book), run the
worker hooks around a forward pass, then apply the worker's report as vLLM would (free blocks on
``finished_sending``, settle ``finished_recving`` / ``failed_recving`` / invalid blocks).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from moriio.domain.params.handoff_tags import PromptBinding
from moriio.domain.params.orders import StepOrders
from moriio.domain.scheduler.consumer.book import ConsumerBook
from moriio.domain.scheduler.producer.book import FinishDecision, ProducerBook
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.service import StepReport
from moriio.testing.stacks import KVMemory, Stack
from moriio_tools.sim.config import Worker
from moriio_tools.sim.invariants import (
    BlockPool,
    Violation,
    check_clean,
    check_deadline,
    check_load_errors,
    violated,
)
from moriio_tools.sim.requests import (
    ConsumerRequest,
    DState,
    NodeEnv,
    Outcome,
    ProducerRequest,
    PState,
    blocks_for,
    prompt_of,
)

BookT = TypeVar("BookT", ProducerBook, ConsumerBook)
RequestT = TypeVar("RequestT", ProducerRequest, ConsumerRequest)


@dataclass(eq=False, repr=False)
class _Node(Generic[BookT, RequestT]):
    """What both engines own: a block pool, KV memory, a scheduler book, one worker, and
    the requests waiting for blocks."""

    env: NodeEnv
    stack: Stack
    worker: Worker
    memory: KVMemory
    book: BookT
    pool: BlockPool
    waiting: deque[RequestT] = field(default_factory=deque, init=False)

    def add(self, request: RequestT) -> None:
        self.waiting.append(request)


@dataclass(eq=False, repr=False)
class ProducerNode(_Node[ProducerBook, ProducerRequest]):
    """A prefill engine: chunked prefill, then hand-off of the request's blocks."""

    prefilling: dict[str, ProducerRequest] = field(default_factory=dict, init=False)
    held: dict[str, ProducerRequest] = field(default_factory=dict, init=False)

    def has_requests(self) -> bool:
        return bool(self.waiting or self.prefilling or self.held)

    def all_requests(self) -> list[ProducerRequest]:
        return [*self.waiting, *self.prefilling.values(), *self.held.values()]

    def abort(self, request: ProducerRequest, now: float) -> None:
        """The client aborted ``request`` before its prefill finished."""
        if request.state is PState.WAITING:
            self.waiting.remove(request)
        elif request.state is PState.PREFILL:
            del self.prefilling[request.rid]
        else:
            return
        decision = self._finish_in_book(request, now, length_capped=False)
        if decision.delay_free:
            self._hold(request, now)
        elif request.blocks:
            self._free(request, "aborted")

    def step(self, tick: int, now: float) -> list[tuple[ProducerRequest, dict[str, object]]]:
        """One engine step; returns the requests that finished with hand-off params."""
        env, bs = self.env, self.env.block_size
        budget = env.token_budget
        scheduled: list[tuple[ProducerRequest, int, int]] = []
        for request in self.prefilling.values():
            n = min(request.plan.tokens - request.computed, env.chunk_tokens, budget)
            if n > 0:
                scheduled.append((request, request.computed, request.computed + n))
                budget -= n
        while self.waiting and budget > 0:
            request = self.waiting[0]
            blocks = self.pool.allocate(request.rid, blocks_for(request.plan.tokens, bs))
            if blocks is None:
                break
            self.waiting.popleft()
            check_clean(self.memory, blocks, "producer", request.rid)
            request.blocks, request.state, request.since_tick = blocks, PState.PREFILL, tick
            self.book.on_allocated(request.rid, request.params)
            self.prefilling[request.rid] = request
            n = min(request.plan.tokens, env.chunk_tokens, budget)
            scheduled.append((request, 0, n))
            budget -= n
        completing = [r for r, _, end in scheduled if end == r.plan.tokens]
        if env.mode is TransferMode.WRITE:
            for request in completing:
                self.book.on_scheduled(request.rid, True, request.blocks, prompt_of(request.plan))
        worker = self.worker
        worker.start_step(self.book.take_orders(), self.stack.service.ctx.wall_now())
        for index, layer in enumerate(self.memory.layer_names):
            for request, start, end in scheduled:
                first, last = start // bs, blocks_for(end, bs)
                self.memory.write_layer(index, request.plan.uid, request.blocks[first:last], first)
            worker.save_layer(layer)
        worker.end_forward()
        report = worker.finish_step()
        return self._update(report, scheduled, completing, tick, now)

    def _update(
        self,
        report: StepReport,
        scheduled: list[tuple[ProducerRequest, int, int]],
        completing: list[ProducerRequest],
        tick: int,
        now: float,
    ) -> list[tuple[ProducerRequest, dict[str, object]]]:
        if report.finished_recving or report.failed_recving or report.invalid_block_ids:
            raise violated(Violation.UNEXPECTED_REPORT, "a producer worker reported loads")
        for request, _, end in scheduled:
            request.computed = end
        handed_off = []
        for request in completing:
            del self.prefilling[request.rid]
            decision = self._finish_in_book(request, now, length_capped=True)
            if decision.delay_free:
                self._hold(request, now)
                request.since_tick = tick
            else:
                self._free(request, "finished without a hand-off")
            if decision.params is not None:
                handed_off.append((request, decision.params))
        sending = sorted(report.finished_sending)
        for rid in sending:
            self._release(rid, "finished_sending")
        for rid in sorted(self.book.on_connector_output(set(sending), now)):
            self._release(rid, "lease expired")
        self._check_deadlines(now)
        return handed_off

    def _finish_in_book(
        self, request: ProducerRequest, now: float, *, length_capped: bool
    ) -> FinishDecision:
        """Tell the book ``request`` ended: whether its blocks are held for a hand-off."""
        return self.book.on_finished(
            request.rid,
            length_capped=length_capped,
            block_ids=list(request.blocks),
            wall_now=self.stack.service.ctx.wall_now(),
            now=now,
            params=request.params,
            prompt=prompt_of(request.plan),
        )

    def _check_deadlines(self, now: float) -> None:
        """Polled at ``now`` (this step), no hand-off may outlive its lease (plus the skew
        allowance) by a poll."""
        lease = self.env.timing.defer_timeout + self.env.timing.clock_skew_allowance
        for request in self.held.values():
            check_deadline(
                f"producer hand-off of {request.rid}",
                request.held_since,
                lease,
                now,
                self.env.timing.tick,
            )

    def _hold(self, request: ProducerRequest, now: float) -> None:
        request.state, request.held_since = PState.HELD, now
        self.held[request.rid] = request

    def _release(self, rid: str, why: str) -> None:
        request = self.held.pop(rid, None)
        if request is None:
            raise violated(
                Violation.RELEASED_TWICE,
                f"producer: {why} for {rid}, which holds no blocks for a hand-off "
                "(released twice, or released while its prefill runs)",
            )
        self._free(request, why)

    def _free(self, request: ProducerRequest, why: str) -> None:
        self.memory.poison(self.pool.free(request.rid, why))


@dataclass(eq=False, repr=False)
class ConsumerNode(_Node[ConsumerBook, ConsumerRequest]):
    """A decode engine: loads KV (READ: in the step, WRITE: asynchronously), then decodes."""

    awaiting: dict[str, ConsumerRequest] = field(default_factory=dict, init=False)
    aborted: dict[str, ConsumerRequest] = field(default_factory=dict, init=False)
    decoding: dict[str, ConsumerRequest] = field(default_factory=dict, init=False)
    _finished: list[ConsumerRequest] = field(default_factory=list, init=False)
    last_orders: StepOrders = field(default_factory=StepOrders, init=False)

    def take_finished(self) -> list[ConsumerRequest]:
        """Requests that ended (blocks freed) since the last call."""
        finished, self._finished = self._finished, []
        return finished

    def has_requests(self) -> bool:
        return bool(self.waiting or self.awaiting or self.aborted or self.decoding)

    def all_requests(self) -> list[ConsumerRequest]:
        return [
            *self.waiting,
            *self.awaiting.values(),
            *self.aborted.values(),
            *self.decoding.values(),
        ]

    def abort(self, request: ConsumerRequest, now: float) -> None:
        """The client aborted ``request``."""
        if request.state is DState.WAITING:
            self.waiting.remove(request)
            self.book.on_finished(request.rid, request.params, _binding(request))
            request.outcome, request.state = Outcome.ABORTED, DState.DONE
            self._finished.append(request)
        elif request.state is DState.AWAITING:
            del self.awaiting[request.rid]
            request.outcome = Outcome.ABORTED
            if self.book.on_finished(request.rid, request.params, _binding(request)):
                request.state = DState.ABORTED_AWAITING
                self.aborted[request.rid] = request
            else:
                self._free(request, "aborted while awaiting its KV")
        elif request.state is DState.DECODING:
            self._finish(request, now)

    def step(self, tick: int, now: float) -> None:
        env, bs = self.env, self.env.block_size
        loading: list[ConsumerRequest] = []
        while self.waiting:
            request = self.waiting[0]
            match = self.book.match(
                request.rid, request.params, request.plan.tokens, request.plan.hit_tokens
            )
            blocks = self.pool.allocate(request.rid, blocks_for(request.plan.tokens, bs) + 1)
            if blocks is None:
                break
            self.waiting.popleft()
            check_clean(self.memory, blocks, "consumer", request.rid)
            prompt = _binding(request)
            if self.book.on_allocated(
                request.rid, request.params, blocks, match.num_tokens, prompt
            ):
                request.params = request.params._replace(do_remote_prefill=False)
            request.blocks, request.since_tick = blocks, tick
            if match.num_tokens > 0:
                first = request.plan.hit_tokens // bs
                end = blocks_for(request.plan.hit_tokens + match.num_tokens, bs)
                request.first_block, request.load_blocks = first, blocks[first:end]
            if match.load_async:
                request.state, request.awaiting_since = DState.AWAITING, now
                self.awaiting[request.rid] = request
            elif match.num_tokens > 0:
                loading.append(request)
            else:
                request.outcome = Outcome.LOCAL_HIT
                self._decode(request)
        worker = self.worker
        started = now
        self.last_orders = self.book.take_orders()
        worker.start_step(self.last_orders, self.stack.service.ctx.wall_now())
        for layer in self.memory.layer_names:
            worker.wait_for_layer(layer)
        worker.end_forward()
        report = worker.finish_step()
        if env.mode is TransferMode.READ:
            t = env.timing
            check_deadline(
                f"consumer step {tick} (synchronous loads)",
                started,
                # a handshake, the transfer timeout, the quarantine of what timed out, and
                # liveness probes, which only a simulation sends inline (blocking)
                t.handshake_timeout
                + t.transfer_timeout
                + t.quarantine_timeout
                + t.liveness_timeout,
                self.stack.service.ctx.clock.now(),
                t.poll_interval,
            )
        self._update(report, loading, now)

    def _update(self, report: StepReport, loading: list[ConsumerRequest], now: float) -> None:
        if report.finished_sending:
            raise violated(Violation.UNEXPECTED_REPORT, "a consumer worker reported sends")
        failed, finished = report.failed_recving, report.finished_recving
        if not failed <= finished:
            raise violated(
                Violation.UNEXPECTED_REPORT,
                f"failed_recving {sorted(failed - finished)} missing from finished_recving",
            )
        ended: list[int] = [b for r in loading for b in r.load_blocks]
        settled: list[tuple[ConsumerRequest, bool]] = []
        for rid in sorted(finished):
            request = self.awaiting.pop(rid, None) or self.aborted.pop(rid, None)
            if request is None:
                raise violated(
                    Violation.UNEXPECTED_REPORT,
                    f"finished_recving for {rid}, which awaits no KV (reported twice or never "
                    "expected)",
                )
            ended.extend(request.load_blocks)
            settled.append((request, rid not in failed))
        invalid = report.invalid_block_ids
        check_load_errors(invalid, ended, "consumer")
        for request in loading:
            settled.append((request, invalid.isdisjoint(request.load_blocks)))
        for request, ok in settled:
            self._settle(request, ok)
            if request.state is DState.ABORTED_AWAITING:
                self._free(request, "writes ended after an abort")
            else:
                self._decode(request)
        self.book.on_connector_output(finished)
        for request in list(self.decoding.values()):
            request.steps_left -= 1
            if request.steps_left <= 0:
                self._finish(request, now)
        self._check_deadlines(now)

    def _check_deadlines(self, now: float) -> None:
        """Polled at ``now`` (this step), no load may outlive its deadline by a poll."""
        t = self.env.timing
        for group in (self.awaiting, self.aborted):
            for request in group.values():
                check_deadline(
                    f"consumer load of {request.rid} ({request.state.value})",
                    request.awaiting_since,
                    # the write fence, and inline liveness probes (as above)
                    t.write_fence_s + t.liveness_timeout,
                    now,
                    t.tick,
                )

    def _settle(self, request: ConsumerRequest, ok: bool) -> None:
        if not ok:
            if request.outcome is None:
                request.outcome = Outcome.LOAD_ERROR
            return
        if not self.memory.holds(request.plan.uid, request.load_blocks, request.first_block):
            raise violated(
                Violation.CORRUPT_KV,
                f"consumer: {request.rid} loaded successfully but blocks {request.load_blocks} "
                "differ from the producer's KV",
            )
        if request.outcome is None:
            request.outcome = Outcome.LOADED

    def _decode(self, request: ConsumerRequest) -> None:
        request.state, request.steps_left = DState.DECODING, request.plan.decode_steps
        self.decoding[request.rid] = request

    def _finish(self, request: ConsumerRequest, now: float) -> None:
        del self.decoding[request.rid]
        if self.book.on_finished(request.rid, request.params, _binding(request)):
            request.state, request.awaiting_since = DState.ABORTED_AWAITING, now
            self.aborted[request.rid] = request
            return
        if request.outcome is Outcome.LOADED and not self.memory.holds(
            request.plan.uid, request.load_blocks, request.first_block
        ):
            raise violated(
                Violation.STRAY_WRITE,
                f"consumer: the loaded blocks of {request.rid} changed before it finished",
            )
        self._free(request, "finished")

    def _free(self, request: ConsumerRequest, why: str) -> None:
        self.memory.poison(self.pool.free(request.rid, why))
        request.state = DState.DONE
        self._finished.append(request)


def _binding(request: ConsumerRequest) -> PromptBinding:
    """The request's prompt binding, of the tokens its producer signed (READ) or all (WRITE)."""
    signature = request.params.signature
    return prompt_of(request.plan, None if signature is None else signature.num_tokens)
