"""Client aborts at each point of a request's life, applied when the request gets there."""

from __future__ import annotations

import enum

from moriio.domain.values.modes import TransferMode
from moriio_tools.sim.requests import DState, Outcome, PState
from moriio_tools.sim.state import SimState
from moriio_tools.sim.workload import AbortPoint, RequestPlan


class _Abort(enum.Enum):
    WAIT = "wait"
    DONE = "done"
    MISSED = "missed"  # the request left the abort point's state for good


PRODUCER_ABORTS = {
    AbortPoint.PRODUCER_WAITING: PState.WAITING,
    AbortPoint.PRODUCER_PREFILL: PState.PREFILL,
}
CONSUMER_ABORTS = {
    AbortPoint.CONSUMER_WAITING: DState.WAITING,
    AbortPoint.CONSUMER_AWAITING: DState.AWAITING,
    AbortPoint.CONSUMER_DECODING: DState.DECODING,
}
CONSUMER_ORDER = {DState.WAITING: 0, DState.AWAITING: 1, DState.DECODING: 2}


class Aborts(SimState):
    """Applies each request's planned abort (a part of ``Simulation``)."""

    def _aborts(self, tick: int, now: float) -> None:
        for uid, plan in list(self._abort_watch.items()):
            verdict = self._try_abort(plan, tick, now)
            if verdict is not _Abort.WAIT:
                del self._abort_watch[uid]
            if verdict is _Abort.DONE:
                self.result.faults[str(plan.abort)] += 1

    def _try_abort(self, plan: RequestPlan, tick: int, now: float) -> _Abort:
        point, uid = plan.abort, plan.uid
        if point in PRODUCER_ABORTS:
            producer, request = self.producer, self._p_requests.get(uid)
            if producer is None or request is None or request.state is PState.HELD:
                return _Abort.MISSED
            if request.state is not PRODUCER_ABORTS[point]:
                return _Abort.WAIT if request.state is PState.WAITING else _Abort.MISSED
            if tick - request.since_tick < plan.abort_after:
                return _Abort.WAIT
            producer.abort(request, now)
            if self.mode is TransferMode.READ:
                self._outcomes[uid] = Outcome.ABORTED
            else:  # the proxy cancels the consumer side as soon as it learns
                d_request, consumer = self._d_requests.get(uid), self.consumer
                if d_request is not None and consumer is not None:
                    consumer.abort(d_request, now)
            return _Abort.DONE
        if point not in CONSUMER_ABORTS:
            return _Abort.WAIT  # before decode: applied when the producer hands it off
        consumer, d_request = self.consumer, self._d_requests.get(uid)
        if consumer is None or uid in self._outcomes:
            return _Abort.MISSED
        if d_request is None:
            return _Abort.WAIT
        want = CONSUMER_ABORTS[point]
        if d_request.state is not want:
            before = CONSUMER_ORDER.get(d_request.state, 99) < CONSUMER_ORDER[want]
            return _Abort.WAIT if before else _Abort.MISSED
        if tick - d_request.since_tick < plan.abort_after:
            return _Abort.WAIT
        consumer.abort(d_request, now)
        return _Abort.DONE
