"""DeviceFence port: knowing, without blocking, that device work queued so far has run.

A WRITE producer must not send a layer's KV before the kernels that wrote it have finished.
Instead of synchronising the device from the forward thread, it records a fence on the
stream that computed the layer and posts the layer once the fence has completed.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol


class DeviceFence(Protocol):
    """A marker recorded on one device stream (an event): complete once the stream reached it."""

    @property
    def stream(self) -> Hashable:
        """The stream it was recorded on; fences of one stream complete in recording order."""
        ...

    def is_complete(self) -> bool:
        """Whether the work queued on the stream before the fence has finished (never blocks)."""
        ...


class FenceSource(Protocol):
    """Records fences on the calling thread's current stream."""

    def record(self) -> DeviceFence | None:
        """A fence after the work queued so far; None when nothing runs asynchronously
        (host memory: the work is done when the call returns)."""
        ...
