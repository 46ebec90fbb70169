"""LayerGates port: per-layer gates a device stream waits on, so a forward's attention reads a
layer's KV only after it landed, without the host waiting (the wait can be captured into a
CUDA graph and replayed).

The host closes every gate in stream order before a forward that loads KV layer by layer,
and opens each gate once that layer's reads ended. A closing is numbered: opening names the
closing it answers, so a forward queued later never passes on a gate opened for an earlier
one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class LayerGates(Protocol):
    """One gate per KV layer, in memory both the host and the device reach."""

    @property
    def count(self) -> int:
        """How many gates (the worker's KV layers, in registration order)."""
        ...

    def close_all(self) -> int:
        """Close every gate in the order of the calling thread's current stream: after the
        work queued on it so far (a forward still running keeps the gates it was given),
        before what is queued next. Returns the closing's number, for :meth:`try_open`."""
        ...

    def try_open(self, index: int, closing: int) -> bool:
        """Open gate ``index`` for ``closing``. False while that closing has not run on the
        stream yet (try again later); True once open, or once a later closing ran (nothing
        waited on this gate in between). Never blocks."""
        ...

    def open_after_copies(self, closing: int, batches: Mapping[int, frozenset[str]]) -> int:
        """Where the device itself can: open gate ``index`` for ``closing`` right after the
        device copies of every batch tagged in ``batches[index]`` (tags as posted), without
        the host. Returns how many gates were so arranged; the host still calls
        :meth:`try_open` once each layer's reads ended (an open gate stays open)."""
        ...

    def enqueue_wait(self, index: int) -> None:
        """Make the calling thread's current stream wait until gate ``index`` is open; while
        the stream is being captured, the wait becomes a node of the graph."""
        ...

    def open_all(self) -> None:
        """Open every gate now (shutdown: nothing may wait on them any longer)."""
        ...
