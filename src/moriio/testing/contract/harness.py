"""What the contract needs from an engine kind: build engines, drive them, provoke conditions."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from moriio.ports import (
    LocalRegion,
    PeerId,
    RemoteRegion,
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)

BLOCK = 4096
NUM_BLOCKS = 16
REGION_BYTES = BLOCK * NUM_BLOCKS
MAX_POLLS = 40_000
Bytes = npt.NDArray[np.uint8]
Int64s = npt.NDArray[np.int64]


class UnsupportedConditionError(Exception):
    """The engine cannot show the condition a check needs; the check does not apply."""


def pattern(seed: int, size: int = REGION_BYTES) -> Bytes:
    """Reproducible random bytes."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def i64(values: list[int] | Int64s) -> Int64s:
    return np.asarray(values, dtype=np.int64)


def expect(condition: bool, message: str) -> None:
    """An assertion that survives ``python -O``."""
    if not condition:
        raise AssertionError(message)


@contextlib.contextmanager
def raises(kind: type[BaseException], match: str = "") -> Iterator[None]:
    """The block must raise ``kind`` with a message that contains ``match`` (a regex)."""
    try:
        yield
    except kind as error:
        if match and not re.search(match, str(error)):
            raise AssertionError(
                f"{kind.__name__} {str(error)!r} does not match {match!r}"
            ) from error
        return
    raise AssertionError(f"expected {kind.__name__} (matching {match!r}), nothing was raised")


class EngineHarness:
    """Builds engines of one kind and provokes the conditions the contract needs.

    Subclasses implement :meth:`create`. ``inject_backpressure`` and ``dead_peer`` raise
    :class:`UnsupportedConditionError` unless overridden for an engine that can show them.
    """

    kind = ""
    # Why a target must call progress for its peers' transfers to end ("" when it need not).
    target_needs_progress = ""

    def __init__(self) -> None:
        self.engines: list[TransferEngine] = []
        self.buffers: list[Bytes] = []  # kept alive while engines may touch them

    def create(self, name: str) -> TransferEngine:
        """A new engine named ``name`` (it must be unique among live engines of the kind)."""
        raise NotImplementedError

    def engine(self, name: str) -> TransferEngine:
        engine = self.create(name)
        self.engines.append(engine)
        return engine

    def pump(self) -> None:
        """Let every engine make progress (a target with no progress thread needs it)."""
        for engine in self.engines:
            with contextlib.suppress(TransferEngineError):  # closed by the check
                engine.progress()

    def inject_backpressure(self, engine: TransferEngine, count: int) -> None:
        """Make the next ``count`` posts of ``engine`` end in BACKPRESSURE."""
        raise UnsupportedConditionError(f"{self.kind or 'this engine'} cannot inject backpressure")

    def hold_completion(self, engine: TransferEngine, hold: bool) -> bool:
        """Keep new posts of ``engine`` in flight; False when the engine cannot."""
        return False

    def dead_peer(self, initiator: TransferEngine) -> RemoteRegion:
        """A region imported from a peer that has since died; holds ``pattern(99)``."""
        raise UnsupportedConditionError(f"{self.kind or 'this engine'} cannot show a dead peer")

    def close(self) -> None:
        for engine in reversed(self.engines):
            engine.close()


def share_region(
    harness: EngineHarness, owner: TransferEngine, importer: TransferEngine, data: Bytes
) -> RemoteRegion:
    """Register ``data`` on ``owner`` and import it on ``importer``."""
    harness.buffers.append(data)
    region = owner.register_region(data.ctypes.data, data.nbytes)
    importer.add_peer(owner.metadata())
    owner.add_peer(importer.metadata())
    peer = importer.add_peer(owner.metadata())
    return importer.import_region(peer, region.descriptor)


def wait(harness: EngineHarness, engine: TransferEngine, handle: TransferHandle) -> TransferStatus:
    """Poll until terminal or backpressured (bounded, so a hang fails instead of blocking)."""
    for i in range(MAX_POLLS):
        status = engine.poll(handle)
        if status.state is not TransferState.IN_PROGRESS:
            return status
        harness.pump()
        if i > 10:
            time.sleep(0.0005)
    raise AssertionError(f"transfer {handle} still in progress after {MAX_POLLS} polls")


@dataclass
class World:
    """Engine ``a`` (initiator) and ``b`` (target), each with one registered buffer."""

    harness: EngineHarness
    a: TransferEngine
    b: TransferEngine
    a_buf: Bytes
    b_buf: Bytes
    a_region: LocalRegion
    b_region: LocalRegion
    peer_b: PeerId
    b_on_a: RemoteRegion

    @classmethod
    def build(cls, harness: EngineHarness) -> World:
        a, b = harness.engine("a"), harness.engine("b")
        a_buf = np.zeros(REGION_BYTES, dtype=np.uint8)
        b_buf = pattern(1)
        harness.buffers += [a_buf, b_buf]
        a_region = a.register_region(a_buf.ctypes.data, a_buf.nbytes)
        b_region = b.register_region(b_buf.ctypes.data, b_buf.nbytes)
        b.add_peer(a.metadata())
        peer_b = a.add_peer(b.metadata())
        b_on_a = a.import_region(peer_b, b_region.descriptor)
        return cls(harness, a, b, a_buf, b_buf, a_region, b_region, peer_b, b_on_a)

    def post(
        self,
        op: TransferOp,
        local_offsets: list[int] | Int64s,
        remote_offsets: list[int] | Int64s,
        sizes: list[int] | Int64s,
        tag: str = "t",
    ) -> TransferHandle:
        return self.a.post(
            op,
            self.a_region,
            self.b_on_a,
            i64(local_offsets),
            i64(remote_offsets),
            i64(sizes),
            tag,
        )

    def run(self, op: TransferOp, lo: list[int], ro: list[int], sizes: list[int]) -> TransferStatus:
        handle = self.post(op, lo, ro, sizes)
        status = wait(self.harness, self.a, handle)
        self.a.release(handle)
        return status
