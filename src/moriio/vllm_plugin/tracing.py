"""The connector's part of a request's timeline (:mod:`moriio.timeline`), by vLLM request id.

Events are ``prefill.<name>`` on the engine that hands KV off and ``decode.<name>`` on the
one that loads it, keyed by the transfer id both share:

* scheduler side: ``arrived`` (the scheduler first looks at the request), ``scheduled``
  (its first forward is scheduled; on a decode, after its KV landed), ``ready`` (a decode's
  load reported done to the scheduler), ``finished``, ``freed`` (a prefill's blocks given
  back);
* worker side: ``decode.posted`` (reads posted), ``decode.announced`` (WRITE blocks
  announced), ``prefill.push_ordered``, ``decode.landed`` / ``prefill.sent`` (the worker
  reports the transfer done).
"""

from __future__ import annotations

from collections.abc import Iterable

from moriio.domain.params.orders import StepOrders
from moriio.domain.params.transfer_params import TransferParams
from moriio.timeline import Timeline

_MAX_TRACKED = 65536  # ids of requests whose last event never came are dropped past this


class RequestTrace:
    """Records events of the requests a connector side has seen with transfer params."""

    def __init__(self, timeline: Timeline) -> None:
        self._timeline = timeline
        self._ids: dict[str, tuple[str, str]] = {}  # request id -> (side, transfer id)

    @classmethod
    def from_env(cls, name: str) -> RequestTrace | None:
        """A trace when ``MORIIO_TIMELINE_DIR`` is set, else None (call sites check)."""
        timeline = Timeline.from_env(name)
        return cls(timeline) if timeline.enabled else None

    def _track(self, request_id: str, side: str, transfer_id: str) -> None:
        if len(self._ids) >= _MAX_TRACKED:
            self._ids.pop(next(iter(self._ids)))
        self._ids[request_id] = (side, transfer_id)

    def arrived(self, request_id: str, params: TransferParams) -> None:
        side = "decode" if params.do_remote_prefill else "prefill"
        self._track(request_id, side, params.transfer_id)
        self._timeline.record(f"{side}.arrived", params.transfer_id)

    def event(self, request_id: str, name: str, *, last: bool = False) -> None:
        """``name`` for a tracked request (others are ignored); ``last``: forget it."""
        known = self._ids.pop(request_id, None) if last else self._ids.get(request_id)
        if known is not None:
            side, transfer_id = known
            self._timeline.record(f"{side}.{name}", transfer_id)

    def events(self, request_ids: Iterable[str] | None, name: str, *, last: bool = False) -> None:
        for request_id in request_ids or ():
            self.event(request_id, name, last=last)

    def orders(self, orders: StepOrders) -> None:
        """Worker side: what this step's orders start."""
        for read in orders.reads:
            self._track(read.request_id, "decode", read.transfer_id)
            self._timeline.record("decode.posted", read.transfer_id)
        for expect in orders.expect_writes:
            self._track(expect.request_id, "decode", expect.transfer_id)
            self._timeline.record("decode.announced", expect.transfer_id)
        for save in orders.saves:
            self._track(save.request_id, "prefill", save.transfer_id)
            self._timeline.record("prefill.push_ordered", save.transfer_id)
        for hold in orders.holds:
            self._track(hold.request_id, "prefill", hold.transfer_id)
