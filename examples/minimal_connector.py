"""A second, minimal KV connector built on moriio's core (``moriio.core``), in one process.

A producer holds one request's KV blocks; a consumer pulls them (READ) into its own blocks
and then releases them, so the producer frees them exactly once. What is moriio's and what
is the connector's own:

- core: layout recognition, the transfer plan (with its per-transfer cache), the poster
  (posting, backpressure retries, deadlines, completion polling) and the ledgers;
- this connector: its transport (:class:`LoopbackEngine`, a ``TransferEngine`` that copies
  between registered host memory), its clock, and how the two sides meet (here: direct
  calls where a real connector sends control messages).

Run it: ``python examples/minimal_connector.py``.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from moriio.core import (
    Allocation,
    LayerSpec,
    LocalRegion,
    MemoryKind,
    Offsets,
    PeerId,
    PlanCache,
    Poster,
    PostRequest,
    ReadLedger,
    ReleaseLedger,
    RemoteRegion,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferPolicy,
    TransferResult,
    TransferState,
    TransferStatus,
    describe_layout,
)

NUM_LAYERS = 4
NUM_BLOCKS = 32
BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE = 16, 2, 8
SPEC = LayerSpec(
    block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, kind="attention"
)
SHAPE = (2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)  # K and V halves separated


class MonotonicClock:
    """The ``Clock`` port on the host's monotonic clock."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(slots=True)
class _Copy:
    op: TransferOp
    local: LocalRegion
    remote: RemoteRegion
    descriptors: list[tuple[int, int, int]]  # (local offset, remote offset, size)


class LoopbackEngine:
    """A ``TransferEngine`` between engines of one process: posts are served on
    :meth:`progress`, like a polled transport; bytes are really copied. It passes moriio's
    engine contract (``moriio.testing.contract``)."""

    def __init__(self, name: str, fabric: dict[str, LoopbackEngine]) -> None:
        self.name = name
        self._fabric = fabric
        fabric[name] = self
        self._regions: dict[int, npt.NDArray[np.uint8]] = {}
        self._next_region = 0
        self._peers: set[str] = set()
        self._imported: set[tuple[str, int]] = set()
        self._queued: dict[TransferHandle, _Copy] = {}
        self._status: dict[TransferHandle, TransferStatus] = {}
        self._next_handle = 0
        self._closed = False

    def metadata(self) -> bytes:
        return self.name.encode()

    def register_region(
        self,
        addr: int,
        length: int,
        kind: MemoryKind = MemoryKind.HOST,
        device_id: int = 0,
        allocation: Allocation | None = None,
    ) -> LocalRegion:
        self._check_open()
        if length <= 0:
            raise ValueError(f"{self.name}: cannot register length={length} bytes")
        if allocation is not None and not allocation.contains(addr, length):
            raise ValueError(f"{self.name}: the region does not lie in its allocation")
        if kind is not MemoryKind.HOST:
            raise TransferEngineError(f"{self.name}: only host memory, not {kind.value}")
        region_id, self._next_region = self._next_region, self._next_region + 1
        buffer = (ctypes.c_uint8 * length).from_address(addr)
        self._regions[region_id] = np.ctypeslib.as_array(buffer)
        descriptor = f"{self.name}/{region_id}".encode()
        return LocalRegion(region_id, addr, length, kind, device_id, descriptor)

    def deregister_region(self, region: LocalRegion) -> None:
        self._regions.pop(region.region_id, None)

    def add_peer(self, metadata: bytes) -> PeerId:
        self._check_open()
        name = metadata.decode()
        if name not in self._fabric:
            raise TransferEngineError(f"{self.name}: no engine named {name!r}")
        self._peers.add(name)
        return PeerId(name)

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        owner, _, region = descriptor.decode().partition("/")
        regions = self._peer(peer)._regions
        if owner != peer or int(region) not in regions:
            raise TransferEngineError(f"{self.name}: {descriptor!r} is not a region of {peer!r}")
        self._imported.add((peer, int(region)))
        return RemoteRegion(peer, int(region), len(regions[int(region)]))

    def remove_peer(self, peer: PeerId) -> None:
        self._peers.discard(peer)
        self._imported = {key for key in self._imported if key[0] != peer}
        for handle, copy in list(self._queued.items()):
            if copy.remote.peer == peer:
                del self._queued[handle]
                self._status[handle] = TransferStatus(TransferState.FAILED, f"{peer} removed")

    def post(
        self,
        op: TransferOp,
        local: LocalRegion,
        remote: RemoteRegion,
        local_offsets: Offsets,
        remote_offsets: Offsets,
        sizes: Offsets,
        tag: str,
    ) -> TransferHandle:
        self._check_open()
        if not len(local_offsets) == len(remote_offsets) == len(sizes):
            raise ValueError(f"{tag}: offset and size arrays differ in length")
        self._peer(remote.peer)
        if (remote.peer, remote.region_id) not in self._imported:
            raise TransferEngineError(f"{tag}: remote region {remote.region_id} not imported")
        if local.region_id not in self._regions:
            raise TransferEngineError(f"{tag}: local region {local.region_id} not registered")
        arrays = (local_offsets.tolist(), remote_offsets.tolist(), sizes.tolist())
        descriptors = list(zip(*arrays, strict=True))
        for i, (lo, ro, n) in enumerate(descriptors):
            if n <= 0 or not (0 <= lo <= local.length - n and 0 <= ro <= remote.length - n):
                raise TransferEngineError(f"{tag}: descriptor {i} {(lo, ro, n)} out of range")
        handle = TransferHandle(self._next_handle)
        self._next_handle += 1
        self._queued[handle] = _Copy(op, local, remote, descriptors)
        self._status[handle] = TransferStatus(TransferState.IN_PROGRESS)
        return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        status = self._status.get(handle)
        if status is None:
            raise TransferEngineError(f"{self.name}: handle {handle} unknown or released")
        return status

    def progress(self) -> None:
        self._check_open()
        queued, self._queued = self._queued, {}
        for handle, copy in queued.items():
            peer = self._fabric.get(copy.remote.peer)
            theirs = None if peer is None else peer._regions.get(copy.remote.region_id)
            mine = self._regions.get(copy.local.region_id)
            if theirs is None or mine is None:
                gone = TransferStatus(TransferState.FAILED, f"{copy.remote.peer}: region gone")
                self._status[handle] = gone
                continue
            for lo, ro, n in copy.descriptors:
                if copy.op is TransferOp.READ:
                    mine[lo : lo + n] = theirs[ro : ro + n]
                else:
                    theirs[ro : ro + n] = mine[lo : lo + n]
            self._status[handle] = TransferStatus(TransferState.SUCCEEDED)

    def cancel(self, handle: TransferHandle) -> None:
        if self._queued.pop(handle, None) is not None:  # not served yet: nothing moves
            self._status[handle] = TransferStatus(TransferState.FAILED, "cancelled")

    def settled(self, handle: TransferHandle) -> bool:
        return self.poll(handle).state is not TransferState.IN_PROGRESS

    def release(self, handle: TransferHandle) -> None:
        self._status.pop(handle, None)

    def close(self) -> None:
        self._closed = True
        self._regions.clear()
        self._queued.clear()
        if self._fabric.get(self.name) is self:
            del self._fabric[self.name]

    def _check_open(self) -> None:
        if self._closed:
            raise TransferEngineError(f"engine {self.name!r} is closed")

    def _peer(self, peer: str) -> LoopbackEngine:
        if peer not in self._peers or peer not in self._fabric:
            raise TransferEngineError(f"{self.name}: peer {peer!r} was not added")
        return self._fabric[peer]


@dataclass(slots=True)
class Side:
    """One engine's paged KV cache (one array per layer) registered with its transport."""

    engine: LoopbackEngine
    layers: dict[str, npt.NDArray[np.float16]] = field(default_factory=dict)
    regions: dict[str, LocalRegion] = field(default_factory=dict)

    @classmethod
    def create(cls, name: str, fabric: dict[str, LoopbackEngine]) -> Side:
        side = cls(LoopbackEngine(name, fabric))
        for i in range(NUM_LAYERS):
            layer = f"layers.{i}"
            kv = np.zeros(SHAPE, dtype=np.float16)
            side.layers[layer] = kv
            side.regions[layer] = side.engine.register_region(kv.ctypes.data, kv.nbytes)
        return side


@dataclass(frozen=True, slots=True)
class RunReport:
    """What one run moved and released."""

    producer: Side
    consumer: Side
    bytes_moved: int
    plans_computed: int
    read: TransferResult
    released: tuple[TransferResult, ...]
    ledger: ReleaseLedger


def run(
    producer_blocks: tuple[int, ...] = (3, 4, 5, 20),
    consumer_blocks: tuple[int, ...] = (0, 1, 2, 9),
    transfer_id: str = "tx-1",
) -> RunReport:
    """Move one request's KV from producer to consumer, then release the producer's blocks."""
    clock, policy = MonotonicClock(), TransferPolicy(transfer_timeout=5.0)
    fabric: dict[str, LoopbackEngine] = {}
    producer, consumer = Side.create("producer", fabric), Side.create("consumer", fabric)
    rng = np.random.default_rng(7)
    for kv in producer.layers.values():  # the prefill's KV
        kv[:, list(producer_blocks)] = rng.standard_normal(kv[:, list(producer_blocks)].shape)

    # Producer: hold the blocks until the consumer releases them (or the deadline passes).
    holds = ReleaseLedger(producer_tp=1)
    holds.track(transfer_id, "prefill-req", clock.now() + policy.defer_timeout, clock.now())

    # Consumer: meet the producer (a handshake message in a real connector) ...
    peer = consumer.engine.add_peer(producer.engine.metadata())
    remote = {
        name: consumer.engine.import_region(peer, region.descriptor)
        for name, region in producer.regions.items()
    }
    # ... plan once per geometry, post one batch per layer, and wait for every layer.
    plans = PlanCache(consumer_blocks, producer_blocks, remote_num_blocks=NUM_BLOCKS)
    reads = ReadLedger()
    deadline = policy.transfer_deadline(clock.now())
    reads.start(transfer_id, "decode-req", consumer.layers, deadline)
    poster = Poster(consumer.engine, clock, policy)
    for name, kv in consumer.layers.items():
        strides = tuple(s // kv.itemsize for s in kv.strides)
        geometry = describe_layout(kv.shape, strides, kv.itemsize, SPEC)
        request = PostRequest(
            transfer_id,
            name,
            TransferOp.READ,
            consumer.regions[name],
            remote[name],
            plans.plan_for(geometry),
        )
        poster.submit(request)
    read: TransferResult | None = None
    while read is None:  # every batch ends by the policy's transfer deadline
        poster.progress_engine()
        for result in poster.progress():
            done = reads.complete(transfer_id, result.request.layer, result.ok, result.message)
            read = done or read

    # Consumer -> producer: "release" (a control message in a real connector).
    if read.ok:
        holds.ack(transfer_id, clock.now())
    else:
        holds.fail(transfer_id, read.message, clock.now())
    released = tuple(holds.pop_released())  # free these requests' blocks, exactly once
    return RunReport(
        producer,
        consumer,
        poster.stats.bytes_moved,
        plans.computations,
        read,
        released,
        holds,
    )


def main() -> None:
    outcome = run()
    for name, kv in outcome.consumer.layers.items():
        got, sent = kv[:, [0, 1, 2, 9]], outcome.producer.layers[name][:, [3, 4, 5, 20]]
        if not np.array_equal(got, sent):
            raise SystemExit(f"layer {name}: the consumer's blocks differ from the producer's")
    print(
        f"read {outcome.read.outcome.value}: {outcome.bytes_moved} bytes over {NUM_LAYERS} "
        f"layers, {outcome.plans_computed} plan computed; released "
        f"{[r.request_id for r in outcome.released]}"
    )


if __name__ == "__main__":
    main()
