"""NIXL loopback transport benchmark: throughput against ``np.copyto``, small-transfer latency.

The target engine runs in a second process (``two_processes=True``, spawned) or in this one.
Every number is measured in the same run: throughput is the median of ``repeats`` timed
256 MiB batches (4096 x 64 KiB by default, one post each) after a warm-up, reported next to
the median ``np.copyto`` of the same number of bytes. Two block orders are measured:
``sequential`` (both sides contiguous: the adapter coalesces them into one descriptor) and
``permuted`` (a random remote order: one UCX operation, i.e. one CMA syscall, per block).
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import numpy.typing as npt

from moriio.adapters.nixl.engine import NixlTransferEngine
from moriio.ports import LocalRegion, RemoteRegion, TransferOp, TransferState

Int64s = npt.NDArray[np.int64]


def _block_pattern(num_blocks: int, block_size: int) -> npt.NDArray[np.uint8]:
    """Block ``i`` holds the byte ``i % 251`` throughout (cheap to build and to verify)."""
    values = (np.arange(num_blocks) % 251).astype(np.uint8)
    return np.repeat(values, block_size)


def _serve_target(conn: Connection, num_blocks: int, block_size: int) -> None:
    """Child process: register the pattern, publish it, drive progress until told to stop."""
    buffer = _block_pattern(num_blocks, block_size)
    engine = NixlTransferEngine(loopback=True)
    region = engine.register_region(buffer.ctypes.data, buffer.nbytes)
    conn.send((engine.metadata(), region.descriptor))
    while True:
        engine.progress()
        if conn.poll(0.001):
            conn.recv()
            break
    engine.close()
    conn.send("closed")


class _Target:
    """The target engine, in a child process or in this process."""

    def __init__(self, two_processes: bool, num_blocks: int, block_size: int) -> None:
        self.pump: Callable[[], None] = lambda: None
        self._local: NixlTransferEngine | None = None
        self._process: Any = None
        if two_processes:
            ctx = multiprocessing.get_context("spawn")
            self._conn, child = ctx.Pipe()
            self._process = ctx.Process(
                target=_serve_target, args=(child, num_blocks, block_size), daemon=True
            )
            self._process.start()
            self.metadata, self.descriptor = self._conn.recv()
        else:
            self._buffer = _block_pattern(num_blocks, block_size)
            self._local = NixlTransferEngine(loopback=True)
            region = self._local.register_region(self._buffer.ctypes.data, self._buffer.nbytes)
            self.metadata, self.descriptor = self._local.metadata(), region.descriptor
            self.pump = self._local.progress

    def close(self) -> None:
        if self._process is not None:
            self._conn.send("stop")
            self._conn.recv()
            self._process.join(timeout=10)
        if self._local is not None:
            self._local.close()


def _transfer(
    engine: NixlTransferEngine,
    pump: Callable[[], None],
    args: tuple[TransferOp, LocalRegion, RemoteRegion, Int64s, Int64s, Int64s],
) -> int:
    """Post one batch and poll it to completion; returns elapsed nanoseconds."""
    start = time.perf_counter_ns()
    handle = engine.post(*args, "bench")
    while (status := engine.poll(handle)).state is TransferState.IN_PROGRESS:
        pump()
    elapsed = time.perf_counter_ns() - start
    engine.release(handle)
    if status.state is not TransferState.SUCCEEDED:
        raise RuntimeError(f"benchmark transfer failed: {status.message}")
    return elapsed


def _percentile_us(samples_ns: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(samples_ns, dtype=np.float64), q)) / 1000.0


def run_transport_benchmark(
    *,
    num_blocks: int = 4096,
    block_size: int = 64 * 1024,
    repeats: int = 7,
    latency_sizes: Sequence[int] = (4096, 64 * 1024),
    latency_iterations: int = 2000,
    two_processes: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure NIXL loopback throughput and latency; returns a flat dict of results."""
    region_bytes = num_blocks * block_size
    target = _Target(two_processes, num_blocks, block_size)
    engine = NixlTransferEngine(loopback=True)
    try:
        local = np.ones(region_bytes, dtype=np.uint8)  # pre-touched
        scratch = np.ones(region_bytes, dtype=np.uint8)
        region = engine.register_region(local.ctypes.data, local.nbytes)
        remote = engine.import_region(engine.add_peer(target.metadata), target.descriptor)
        blocks = np.arange(num_blocks, dtype=np.int64)
        perm = np.random.default_rng(seed).permutation(num_blocks).astype(np.int64)
        sizes = np.full(num_blocks, block_size, dtype=np.int64)
        orders = {"sequential": blocks, "permuted": perm}
        results: dict[str, Any] = {
            "processes": 2 if two_processes else 1,
            "num_blocks": num_blocks,
            "block_size": block_size,
            "region_bytes": region_bytes,
            "repeats": repeats,
        }

        # READ under the permutation, verified: block i of local holds remote block perm[i].
        read_perm = (TransferOp.READ, region, remote, blocks * block_size, perm * block_size, sizes)
        _transfer(engine, target.pump, read_perm)
        expected = (perm % 251).astype(np.uint8)
        results["verified"] = bool(
            (local.reshape(num_blocks, block_size) == expected[:, None]).all()
        )

        copy_ns = []
        for _ in range(repeats + 1):
            start = time.perf_counter_ns()
            np.copyto(scratch, local)
            copy_ns.append(time.perf_counter_ns() - start)
        results["memcpy_gbps"] = region_bytes / statistics.median(copy_ns[1:])
        for name, order in orders.items():
            for op in (TransferOp.READ, TransferOp.WRITE):
                args = (op, region, remote, blocks * block_size, order * block_size, sizes)
                _transfer(engine, target.pump, args)  # warm-up
                samples = [_transfer(engine, target.pump, args) for _ in range(repeats)]
                gbps = region_bytes / statistics.median(samples)
                key = f"{op.value}_{name}"
                results[f"{key}_gbps"] = gbps
                results[f"{key}_ratio"] = gbps / results["memcpy_gbps"]

        zero = np.zeros(1, dtype=np.int64)
        for size in latency_sizes:
            args = (TransferOp.READ, region, remote, zero, zero, np.array([size], np.int64))
            for _ in range(min(200, latency_iterations)):
                _transfer(engine, target.pump, args)
            samples = [_transfer(engine, target.pump, args) for _ in range(latency_iterations)]
            results[f"latency_{size}_p50_us"] = _percentile_us(samples, 50)
            results[f"latency_{size}_p99_us"] = _percentile_us(samples, 99)
        return results
    finally:
        engine.close()
        target.close()
