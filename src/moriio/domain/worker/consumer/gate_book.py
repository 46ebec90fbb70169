"""Which layer gates a layerwise READ's forward waits on, and when each one opens.

A forward that loads KV layer by layer is armed before it is queued: every gate closes in
stream order. A layer's gate opens once every read of that forward's transfers for the
layer ended, failed or not (a failure is reported through the load report as ever; the gate
only stops the device from waiting). Where a layer's reads are all device copies already
queued, the device opens its gate itself right after them, with no host polling in between
(the host's opening then finds it open). Forwards are opened in the order they were armed,
so a gate never opens for a later forward before an earlier one's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from moriio.ports import LayerGates

# Whether a read among the given transfers still waits on the named layer.
WaitingOn = Callable[[str, frozenset[str]], bool]


def batch_tag(transfer_id: str, layer: str) -> str:
    """The tag of a transfer's batch for one layer, as the poster posts it."""
    return f"{transfer_id}/{layer}"


@dataclass(slots=True)
class _ArmedForward:
    closing: int
    transfers: frozenset[str]
    closed: set[int] = field(default_factory=set)  # gate indices not opened yet


class GateBook:
    """The armed forwards of one worker and their gates still closed."""

    def __init__(self, gates: LayerGates, layers: Sequence[str]) -> None:
        if gates.count != len(layers):
            raise ValueError(f"{gates.count} layer gates for {len(layers)} KV layers")
        self._gates = gates
        self._index = {name: i for i, name in enumerate(layers)}
        self._armed: deque[_ArmedForward] = deque()
        self.forwards_armed = 0
        self.gates_opened = 0
        self.opened_by_device = 0  # gates the device opens itself, after the layer's copies

    def index_of(self, layer: str) -> int | None:
        return self._index.get(layer)

    @property
    def armed(self) -> bool:
        """Whether a forward still has a closed gate (the device may wait on it)."""
        return bool(self._armed)

    @property
    def last_armed(self) -> frozenset[str]:
        """The transfers of the forward armed last (empty when none is armed)."""
        return self._armed[-1].transfers if self._armed else frozenset()

    def arm(self, transfers: frozenset[str]) -> None:
        """The next forward reads these layerwise transfers: close every gate before it."""
        if not transfers:
            return
        closing = self._gates.close_all()
        self._armed.append(_ArmedForward(closing, transfers, set(self._index.values())))
        self.forwards_armed += 1
        batches = {
            i: frozenset(batch_tag(t, name) for t in transfers) for name, i in self._index.items()
        }
        self.opened_by_device += self._gates.open_after_copies(closing, batches)

    def open_ready(self, waiting_on: WaitingOn) -> None:
        """Open, forward by forward, the gates of layers none of whose reads still runs."""
        while self._armed:
            forward = self._armed[0]
            for name, index in self._index.items():
                if index not in forward.closed or waiting_on(name, forward.transfers):
                    continue
                if self._gates.try_open(index, forward.closing):
                    forward.closed.discard(index)
                    self.gates_opened += 1
            if forward.closed:
                return
            self._armed.popleft()

    def open_all(self) -> None:
        """Open every gate and forget the armed forwards (the worker shuts down)."""
        self._armed.clear()
        self._gates.open_all()
