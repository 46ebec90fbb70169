"""A fake device stream for layer-gate tests: memory operations and "kernels" queued in
order, run only when the test says, a wait stopping the stream until its word has the bit.

It lags behind the host on purpose, as a device running an earlier forward does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

BASE_ADDRESS = 0x10_0000
WORD_BYTES = 4


@dataclass(frozen=True, slots=True)
class _Wait:
    index: int
    bits: int


@dataclass(frozen=True, slots=True)
class _Write:
    index: int
    value: int


@dataclass(frozen=True, slots=True)
class _Kernel:
    run: Callable[[], None]


class FakeStream:
    """:class:`~moriio.vllm_plugin.stream_gates.StreamMemOps` over ``words`` (the gate flags,
    at :data:`BASE_ADDRESS`), plus :meth:`kernel` for the work a forward queues."""

    def __init__(self, count: int) -> None:
        self.words = np.zeros(count, dtype=np.uint32)
        self._queue: deque[_Wait | _Write | _Kernel] = deque()
        self.waits_queued = 0

    def _index(self, address: int) -> int:
        index, rest = divmod(address - BASE_ADDRESS, WORD_BYTES)
        if rest or not 0 <= index < len(self.words):
            raise ValueError(f"address {address:#x} is not a gate's")
        return index

    def wait_any_bit(self, stream: int, address: int, bits: int) -> None:
        self.waits_queued += 1
        self._queue.append(_Wait(self._index(address), bits))

    def write(self, stream: int, address: int, value: int) -> None:
        self._queue.append(_Write(self._index(address), value))

    def kernel(self, run: Callable[[], None]) -> None:
        self._queue.append(_Kernel(run))

    @property
    def pending(self) -> int:
        return len(self._queue)

    def run(self) -> bool:
        """Run queued work until a wait blocks or nothing is left; True when drained."""
        while self._queue:
            op = self._queue[0]
            if isinstance(op, _Wait):
                if not int(self.words[op.index]) & op.bits:
                    return False
            elif isinstance(op, _Write):
                self.words[op.index] = op.value
            else:
                op.run()
            self._queue.popleft()
        return True
