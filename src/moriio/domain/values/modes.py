"""How KV moves between a producer (prefill) and a consumer (decode), and when it is loaded."""

from __future__ import annotations

import enum


class TransferMode(enum.Enum):
    READ = "read"  # decode pulls
    WRITE = "write"  # prefill pushes


class LoadMode(enum.Enum):
    """When a consumer's READ loads land relative to the forward that uses them."""

    ASYNC = "async"  # before the request is scheduled (it waits in WAITING_FOR_REMOTE_KVS)
    LAYERWISE = "layerwise"  # inside the request's first forward, awaited layer by layer
