"""WRITE producer: layer saves that wait for the device work that computed them.

The forward thread never blocks on the device. When a layer's KV is computed it records a
fence on its current stream (:class:`~moriio.ports.FenceSource`) and queues the save here;
the worker's progress takes a save once its fence completed and only then posts the layer.
The end of a forward is queued the same way and is taken only after every layer of that
forward (on every stream) was taken. Host memory has no fences: saves run at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

from moriio.ports import DeviceFence


class HostFences:
    """The fence source of host memory: work is complete when the hook is called."""

    def record(self) -> DeviceFence | None:
        return None


@dataclass(frozen=True, slots=True)
class FencedLayer:
    """``layer`` of forward ``forward`` is computed once ``fence`` completed."""

    forward: int
    layer: str
    fence: DeviceFence


@dataclass(frozen=True, slots=True)
class FencedEnd:
    """Forward ``forward`` ended (every layer it computed is final) once ``fence`` completed."""

    forward: int
    fence: DeviceFence


class FencedSaves:
    """Saves waiting for their fence: in order per stream, ends after their forward's layers."""

    def __init__(self) -> None:
        self._layers: dict[Hashable, deque[FencedLayer]] = {}
        self._ends: deque[FencedEnd] = deque()

    def __len__(self) -> int:
        return sum(len(q) for q in self._layers.values()) + len(self._ends)

    def add_layer(self, forward: int, layer: str, fence: DeviceFence) -> None:
        self._layers.setdefault(fence.stream, deque()).append(FencedLayer(forward, layer, fence))

    def add_end(self, forward: int, fence: DeviceFence) -> None:
        self._ends.append(FencedEnd(forward, fence))

    def take_ready(self) -> list[FencedLayer | FencedEnd]:
        """The saves whose fence completed, in the order they must be applied.

        A stream's saves are taken in recording order (a later fence of a stream is never
        taken before an earlier one); an end waits for every layer of its forward.
        """
        ready: list[FencedLayer | FencedEnd] = []
        for stream in list(self._layers):
            queue = self._layers[stream]
            while queue and queue[0].fence.is_complete():
                ready.append(queue.popleft())
            if not queue:
                del self._layers[stream]
        while self._ends:
            end = self._ends[0]
            if self._waits_for_layers(end.forward) or not end.fence.is_complete():
                break
            ready.append(self._ends.popleft())
        return ready

    def _waits_for_layers(self, forward: int) -> bool:
        return any(queue[0].forward <= forward for queue in self._layers.values())

    def clear(self) -> None:
        self._layers.clear()
        self._ends.clear()
