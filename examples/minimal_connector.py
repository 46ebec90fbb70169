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
    local_offsets: Offsets
    remote_offsets: Offsets
    sizes: Offsets


@dataclass(slots=True)
class LoopbackEngine:
    """A ``TransferEngine`` between engines of one process: posts are served on
    :meth:`progress`, like a polled transport; bytes are really copied."""

    name: str
    fabric: dict[str, LoopbackEngine]
    _regions: dict[int, npt.NDArray[np.uint8]] = field(default_factory=dict)
    _peers: set[str] = field(default_factory=set)
    _queued: dict[TransferHandle, _Copy] = field(default_factory=dict)
    _status: dict[TransferHandle, TransferStatus] = field(default_factory=dict)
    _next: int = 0

    def __post_init__(self) -> None:
        self.fabric[self.name] = self

    def metadata(self) -> bytes:
        return self.name.encode()

    def register_region(
        self, addr: int, length: int, kind: MemoryKind = MemoryKind.HOST, device_id: int = 0
    ) -> LocalRegion:
        if kind is not MemoryKind.HOST:
            raise TransferEngineError(f"{self.name}: only host memory, not {kind.value}")
        region_id = len(self._regions)
        buffer = (ctypes.c_uint8 * length).from_address(addr)
        self._regions[region_id] = np.ctypeslib.as_array(buffer)
        return LocalRegion(region_id, addr, length, kind, device_id, str(region_id).encode())

    def deregister_region(self, region: LocalRegion) -> None:
        self._regions.pop(region.region_id, None)

    def add_peer(self, metadata: bytes) -> PeerId:
        name = metadata.decode()
        if name not in self.fabric:
            raise TransferEngineError(f"{self.name}: no engine named {name!r}")
        self._peers.add(name)
        return PeerId(name)

    def import_region(self, peer: PeerId, descriptor: bytes) -> RemoteRegion:
        region_id = int(descriptor.decode())
        return RemoteRegion(peer, region_id, len(self._peer(peer)._regions[region_id]))

    def remove_peer(self, peer: PeerId) -> None:
        self._peers.discard(peer)

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
        self._peer(remote.peer)
        for offsets, length, side in (
            (local_offsets, local.length, "local"),
            (remote_offsets, remote.length, "remote"),
        ):
            if len(offsets) and (offsets.min() < 0 or (offsets + sizes).max() > length):
                raise TransferEngineError(f"{tag}: {side} descriptor outside its region")
        handle = TransferHandle(self._next)
        self._next += 1
        self._queued[handle] = _Copy(op, local, remote, local_offsets, remote_offsets, sizes)
        self._status[handle] = TransferStatus(TransferState.IN_PROGRESS)
        return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        status = self._status.get(handle)
        if status is None:
            raise TransferEngineError(f"{self.name}: unknown handle {handle}")
        return status

    def progress(self) -> None:
        queued, self._queued = self._queued, {}
        for handle, copy in queued.items():
            mine = self._regions[copy.local.region_id]
            theirs = self._peer(copy.remote.peer)._regions[copy.remote.region_id]
            src, dst = (theirs, mine) if copy.op is TransferOp.READ else (mine, theirs)
            src_offsets, dst_offsets = (
                (copy.remote_offsets, copy.local_offsets)
                if copy.op is TransferOp.READ
                else (copy.local_offsets, copy.remote_offsets)
            )
            for s, d, n in zip(src_offsets, dst_offsets, copy.sizes, strict=True):
                dst[d : d + n] = src[s : s + n]
            self._status[handle] = TransferStatus(TransferState.SUCCEEDED)

    def release(self, handle: TransferHandle) -> None:
        self._status.pop(handle, None)

    def close(self) -> None:
        self._regions.clear()
        self._queued.clear()
        self._status.clear()
        self.fabric.pop(self.name, None)

    def _peer(self, peer: str) -> LoopbackEngine:
        if peer not in self._peers:
            raise TransferEngineError(f"{self.name}: peer {peer!r} was not added")
        return self.fabric[peer]


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
