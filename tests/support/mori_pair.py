"""Two mori adapters over the stand-in mori package, and helpers the mori tests share.

``a`` reads from (or writes to) ``b``; both hold one region. mori completes transfers on its
own threads, so every wait here is bounded in time rather than in polls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from moriio.adapters.mori import MoriTransferEngine
from moriio.ports import (
    LocalRegion,
    RemoteRegion,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)

SIZE = 8192
WAIT = 5.0  # seconds any single wait in these tests may take before it fails


def finish(engine: MoriTransferEngine, handle: TransferHandle) -> TransferStatus:
    """Poll until the batch leaves IN_PROGRESS."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        status = engine.poll(handle)
        if status.state is not TransferState.IN_PROGRESS:
            return status
        time.sleep(0.0005)
    raise AssertionError("stand-in transfer did not complete")


def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()`` holds (mori's threads make it so)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.001)


def in_thread(work: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


class Pair:
    """Engine ``a`` reads from engine ``b``; both hold one region."""

    def __init__(self, size: int = SIZE, **engine_kwargs: Any) -> None:
        self.size = size
        self.kwargs = engine_kwargs
        self.a = MoriTransferEngine("a", **engine_kwargs)
        self.b = MoriTransferEngine("b", **engine_kwargs)
        self.a_buf = np.zeros(size, np.uint8)
        self.b_buf = np.arange(size, dtype=np.int64).astype(np.uint8)
        self.a_region = self.a.register_region(self.a_buf.ctypes.data, size)
        self.b_region = self.b.register_region(self.b_buf.ctypes.data, size)
        self.b.add_peer(self.a.metadata())
        self.peer = self.a.add_peer(self.b.metadata())
        self.remote = self.a.import_region(self.peer, self.b_region.descriptor)
        assert self.a.wait_for_connections(WAIT)

    def post(
        self,
        pieces: int = 1,
        *,
        gap: int = 0,
        op: TransferOp = TransferOp.READ,
        local: LocalRegion | None = None,
        remote: RemoteRegion | None = None,
    ) -> TransferHandle:
        """``pieces`` descriptors over the region; ``gap`` bytes between them on the remote
        side keep mori from merging them into one work request."""
        step = self.size // pieces
        length = step - gap
        local_offsets = np.arange(pieces, dtype=np.int64) * step
        return self.a.post(
            op,
            local or self.a_region,
            remote or self.remote,
            local_offsets,
            local_offsets.copy(),
            np.full(pieces, length, np.int64),
            "t",
        )

    def read(self, **kwargs: Any) -> TransferHandle:
        return self.post(**kwargs)

    def finish(self, handle: TransferHandle) -> TransferStatus:
        return finish(self.a, handle)

    def restart_b(self, stand_in: ModuleType) -> None:
        """``b``'s process dies and a new one starts under the same name, same region layout."""
        stand_in.crash(self.b.name)
        self.b = MoriTransferEngine("b", **self.kwargs)
        self.b_buf = np.full(self.size, 7, np.uint8)
        self.b_region = self.b.register_region(self.b_buf.ctypes.data, self.size)
        self.b.add_peer(self.a.metadata())
        self.peer = self.a.add_peer(self.b.metadata())
        self.remote = self.a.import_region(self.peer, self.b_region.descriptor)
