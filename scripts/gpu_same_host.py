"""Same-host device copies as users get them (part of ``scripts/gpu_check.py``).

Each case posts ``--batches`` batches back to back through the connector's engine (the
transport wrapped in moriio's same-host copies) and reports, apart: the host's time per post
(``post`` returns once the launch is queued), the kernels' time between device events
recorded on the copier's stream before the first and after the last batch, and the device's
own contiguous copy of the same bytes timed the same way in the same run (the ratio is the
figure to judge: 0.5x is the target for scattered blocks). Cases: random blocks READ and
WRITE, and a 61-layer request (every layer's blocks) as one batch. Bytes are verified.

On a GPU the peer is another process (``cuda:1`` where there are two GPUs), mapped through
CUDA/HIP IPC. The dry run uses two engines of this process over host memory (their "IPC"
a shared address), so the same timing and verification code runs on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moriio.adapters.device.copier import DeviceCopier
from moriio.adapters.device.envelope import ProcessIdentity
from moriio.adapters.device.peer_memory import Export
from moriio.adapters.device.same_host import SameHostDeviceEngine
from moriio.ports import MemoryKind, TransferOp, TransferState
from moriio.testing.inmemory import InMemoryFabric, InMemoryTransferEngine

TIMEOUT = 60.0
TARGET = 0.5  # scattered blocks at half the device's contiguous copy, or better


@dataclass
class Peer:
    """What a case needs of the two sides: the engine, the regions, this side's bytes, and
    calls that fill, zero and digest the peer's."""

    device: torch.device
    engine: Any
    region: Any
    remote: Any
    kv: torch.Tensor
    fill: Callable[[int, int], None]
    zero: Callable[[], None]
    digest: Callable[[int, int], str]


class Clock:
    """Device events on the copier's stream (host: the wall clock)."""

    def __init__(self, copier: DeviceCopier) -> None:
        self._stream = getattr(copier.stream, "stream", None)

    def mark(self) -> Any:
        if self._stream is None:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record(self._stream)
        return event

    def seconds(self, start: Any, end: Any) -> float:
        if self._stream is None:
            return float(end - start)
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3


def _wait(engine: Any, handles: list[Any]) -> None:
    deadline = time.perf_counter() + TIMEOUT
    for handle in handles:
        while (status := engine.poll(handle)).state is TransferState.IN_PROGRESS:
            if time.perf_counter() > deadline:
                raise RuntimeError("a same-host batch did not complete in time")
        if status.state is not TransferState.SUCCEEDED:
            raise RuntimeError(f"a same-host batch ended {status.state.value}: {status.message}")
        engine.release(handle)


def timed(peer: Peer, op: TransferOp, lo: np.ndarray, ro: np.ndarray, sizes: np.ndarray, batches: int) -> tuple[float, float]:
    """(host seconds per post, kernel seconds per batch) of ``batches`` back-to-back posts."""
    engine = peer.engine
    clock = Clock(engine.copier)
    _wait(engine, [engine.post(op, peer.region, peer.remote, lo, ro, sizes, "warm-up")])
    start, host, handles = clock.mark(), 0.0, []
    for _ in range(batches):
        began = time.perf_counter()
        handles.append(engine.post(op, peer.region, peer.remote, lo, ro, sizes, "timed"))
        host += time.perf_counter() - began
    end = clock.mark()
    _wait(engine, handles)
    return host / batches, clock.seconds(start, end) / batches


def contiguous_seconds(device: torch.device, nbytes: int, batches: int) -> float:
    """The device's own copy of ``nbytes`` contiguous bytes, per copy, timed like a batch."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if device.type == "cpu":
        began = time.perf_counter()
        for _ in range(batches):
            dst.copy_(src)
        return (time.perf_counter() - began) / batches
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(batches):
        dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / batches


def _frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for array in arrays:
        array.flags.writeable = False
    return arrays


def _expected(
    src: np.ndarray, dst: np.ndarray, d_off: np.ndarray, s_off: np.ndarray, block: int
) -> np.ndarray:
    out = dst.copy()
    out.reshape(-1, block)[d_off // block] = src.reshape(-1, block)[s_off // block]
    return out


def cases(span: int, block: int, layers: int, seed: int = 7) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, local offsets, remote offsets): random blocks over the span, then a request of
    ``layers`` layers (the span cut into layer regions, the same blocks in every layer)."""
    rng = np.random.default_rng(seed)
    count = span // block
    random = [("random", rng.permutation(count) * block, rng.permutation(count) * block)]
    per_layer = (span // layers) // block
    if per_layer < 1:
        return random
    stride = per_layer * block
    local_blocks, remote_blocks = rng.permutation(per_layer), rng.permutation(per_layer)
    layer = np.repeat(np.arange(layers), per_layer) * stride
    lo = layer + np.tile(local_blocks, layers) * block
    ro = layer + np.tile(remote_blocks, layers) * block
    return [*random, (f"request {layers} layers", lo, ro)]


def same_host_rows(peer: Peer, block: int, layers: int, batches: int, row: Callable[..., Any], pattern: Callable[[int, int, torch.device], torch.Tensor], digest: Callable[[torch.Tensor], str]) -> list[Any]:
    span = peer.kv.numel() // block * block
    rows = []
    for name, lo_raw, ro_raw in cases(span, block, layers):
        lo, ro = _frozen(lo_raw.astype(np.int64), ro_raw.astype(np.int64))
        (sizes,) = _frozen(np.full(len(lo), block, dtype=np.int64))
        reference = contiguous_seconds(peer.device, int(sizes.sum()), batches)
        for op in (TransferOp.READ, TransferOp.WRITE):
            seed = 300 + len(rows)
            if op is TransferOp.READ:
                peer.fill(seed, span)
                peer.kv.zero_()
            else:
                peer.kv[:span].copy_(pattern(seed, span, peer.device))
                peer.zero()
            host, kernel = timed(peer, op, lo, ro, sizes, batches)
            source = pattern(seed, span, torch.device("cpu")).numpy()
            blank = np.zeros(span, dtype=np.uint8)
            if op is TransferOp.READ:
                want = _expected(source, blank, lo, ro, block)
                ok = digest(peer.kv[:span]) == digest(torch.from_numpy(want))
            else:
                want = _expected(source, blank, ro, lo, block)
                ok = peer.digest(0, span) == digest(torch.from_numpy(want))
            moved = float(sizes.sum())
            ratio = reference / kernel if kernel > 0 else float("inf")
            detail = (
                f"{len(lo)} x {block >> 10} KiB in one batch: host {host * 1e6:.0f} us/post, "
                f"kernels {moved / kernel / 1e9:.1f} GB/s = {ratio:.2f}x the contiguous copy"
                f" (target {TARGET}x{'' if ratio >= TARGET else ', NOT MET'})"
            )
            rows.append(row(f"same-host {op.value} {name}", detail, ok, moved / kernel / 1e9, moved / reference / 1e9))
    return rows


class SharedAddressMemory:
    """PeerMemory of two engines in one process: the handle is the address (dry run)."""

    def export(self, address: int) -> Export:
        return Export(address.to_bytes(8, "little") + bytes(56), 0)

    def open(self, handle: bytes) -> int:
        return int.from_bytes(handle[:8], "little")

    def close(self, handle: bytes) -> None:
        return None


def in_process_peer(nbytes: int, pattern: Callable[[int, int, torch.device], torch.Tensor], digest: Callable[[torch.Tensor], str]) -> Peer:
    """Two engines of this process over host memory, mapped by address (the dry run)."""
    cpu = torch.device("cpu")
    fabric, memory = InMemoryFabric(), SharedAddressMemory()
    mine = SameHostDeviceEngine(
        InMemoryTransferEngine("mine", fabric), memory, DeviceCopier(cpu),
        identity=ProcessIdentity("host", "mine", 1),
    )
    theirs = SameHostDeviceEngine(
        InMemoryTransferEngine("theirs", fabric), memory, DeviceCopier(cpu),
        identity=ProcessIdentity("host", "theirs", 2),
    )
    kv = torch.zeros(nbytes, dtype=torch.uint8)
    peer_kv = torch.zeros(nbytes, dtype=torch.uint8)
    region = mine.register_region(kv.data_ptr(), nbytes, MemoryKind.DEVICE)
    peer_region = theirs.register_region(peer_kv.data_ptr(), nbytes, MemoryKind.DEVICE)
    remote = mine.import_region(mine.add_peer(theirs.metadata()), peer_region.descriptor)

    def fill(seed: int, span: int) -> None:
        peer_kv[:span].copy_(pattern(seed, span, cpu))

    return Peer(
        cpu, mine, region, remote, kv, fill, peer_kv.zero_, lambda a, b: digest(peer_kv[a:b])
    )
