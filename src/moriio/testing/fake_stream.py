"""A fake device for layer-gate and copy-ordering tests: memory operations and "kernels"
queued per stream, in order, run only when the test says; a wait stops its stream until its
word has the bit, an ordering until the other stream ran what it had queued.

It lags behind the host on purpose, as a device running an earlier forward does. Streams
are told apart by their handle (0 unless a test uses several).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from moriio.adapters.device.copier import CopyStream

BASE_ADDRESS = 0x10_0000
WORD_BYTES = 4


@dataclass(frozen=True, slots=True)
class _Wait:
    index: int
    bits: int


@dataclass(frozen=True, slots=True)
class _AtLeast:
    index: int
    value: int  # compared modulo 2**32, as a signed difference


@dataclass(frozen=True, slots=True)
class _Write:
    index: int
    value: int


@dataclass(frozen=True, slots=True)
class _Kernel:
    run: Callable[[], None]


@dataclass(frozen=True, slots=True)
class _After:
    stream: int
    ops: int  # until that stream ran this many operations


_Op = _Wait | _AtLeast | _Write | _Kernel | _After


class FakeStream:
    """:class:`~moriio.adapters.device.stream_gates.StreamMemOps` over ``words`` (the gate
    flags, at :data:`BASE_ADDRESS`), plus :meth:`kernel` for the work a forward queues."""

    def __init__(self, count: int) -> None:
        self.words = np.zeros(count, dtype=np.uint32)
        self._queues: dict[int, deque[_Op]] = {}
        self._queued: dict[int, int] = {}  # operations ever queued, per stream
        self._ran: dict[int, int] = {}  # operations run, per stream
        self.waits_queued = 0

    def _index(self, address: int) -> int:
        index, rest = divmod(address - BASE_ADDRESS, WORD_BYTES)
        if rest or not 0 <= index < len(self.words):
            raise ValueError(f"address {address:#x} is not a gate's")
        return index

    def _queue(self, stream: int, op: _Op) -> None:
        self._queues.setdefault(stream, deque()).append(op)
        self._queued[stream] = self._queued.get(stream, 0) + 1

    def wait_any_bit(self, stream: int, address: int, bits: int) -> None:
        self.waits_queued += 1
        self._queue(stream, _Wait(self._index(address), bits))

    def wait_at_least(self, stream: int, address: int, value: int) -> None:
        self._queue(stream, _AtLeast(self._index(address), value))

    def write(self, stream: int, address: int, value: int) -> None:
        self._queue(stream, _Write(self._index(address), value))

    def order_after(self, stream: int, other: int) -> None:
        self._queue(stream, _After(other, self._queued.get(other, 0)))

    def kernel(self, run: Callable[[], None], stream: int = 0) -> None:
        self._queue(stream, _Kernel(run))

    def queued(self, stream: int) -> int:
        """Operations ever queued on ``stream``."""
        return self._queued.get(stream, 0)

    def ran(self, stream: int) -> int:
        """Operations ``stream`` has run."""
        return self._ran.get(stream, 0)

    @property
    def pending(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def ran_all(self, stream: int) -> bool:
        """Whether ``stream`` ran everything queued on it so far."""
        return not self._queues.get(stream)

    def _blocked(self, op: _Op) -> bool:
        if isinstance(op, _Wait):
            return not int(self.words[op.index]) & op.bits
        if isinstance(op, _After):
            return self._ran.get(op.stream, 0) < op.ops
        if isinstance(op, _AtLeast):
            ahead = (int(self.words[op.index]) - op.value) & 0xFFFFFFFF
            return ahead >= 1 << 31
        return False

    def _step(self, stream: int) -> bool:
        """Run ``stream`` until it blocks or is empty; whether it ran anything."""
        queue = self._queues.get(stream)
        ran = False
        while queue:
            op = queue[0]
            if self._blocked(op):
                break
            if isinstance(op, _Write):
                self.words[op.index] = op.value
            elif isinstance(op, _Kernel):
                op.run()
            queue.popleft()
            self._ran[stream] = self._ran.get(stream, 0) + 1
            ran = True
        return ran

    def run(self, order: Sequence[int] | None = None) -> bool:
        """Run queued work (stream by stream, in ``order`` if given) until every stream is
        blocked or empty; True when everything ran."""
        progressed = True
        while progressed:
            streams = list(order) if order is not None else sorted(self._queues)
            progressed = False
            for stream in streams:
                progressed |= self._step(stream)
        return self.pending == 0


@dataclass(slots=True)
class FakeCompletion:
    """Complete once ``stream`` of ``device`` ran ``upto`` operations."""

    device: FakeStream
    stream: int
    upto: int
    error: str = ""

    def query(self) -> bool:
        return self.device.ran(self.stream) >= self.upto


class FakeCopyStream:
    """:class:`~moriio.adapters.device.copier.CopyStream` on stream ``handle`` of
    ``device``; the calling thread's current stream is ``caller`` (a test switches it)."""

    def __init__(self, device: FakeStream, handle: int, caller: int = 0) -> None:
        self.device = device
        self.handle = handle
        self.caller = caller

    def order_after_caller(self) -> None:
        self.device.order_after(self.handle, self.caller)

    def order_after(self, other: CopyStream) -> None:
        self.device.order_after(self.handle, other.handle)

    def submit(self, launch: Callable[[], None]) -> FakeCompletion:
        self.device.kernel(launch, self.handle)
        return self.marker()

    def marker(self) -> FakeCompletion:
        return FakeCompletion(self.device, self.handle, self.device.queued(self.handle))
