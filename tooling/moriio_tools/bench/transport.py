"""Transport benchmark: NIXL loopback throughput vs memcpy, latency, and a block-size sweep.

The headline figures come from :func:`moriio_tools.bench.nixl_engine.run_transport_benchmark`
(a target engine in a second process): ``gbps`` is a READ of contiguous blocks (one
coalesced descriptor), next to ``np.copyto`` of the same bytes; the permuted-order figures
(one operation per block) sit beside it. The sweep moves a fixed total in permuted blocks of
each size between two engines in this process, next to a numpy gather of the same blocks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from moriio.ports import TransferEngineError, TransferOp, TransferState

KEYS = ("gbps", "memcpy_gbps", "ratio", "latency_us_p50", "latency_us_p99")
SWEEP_SIZES = tuple(4096 << i for i in range(9))  # 4 KiB .. 1 MiB
TARGET_RATIO = 0.8


def _nulls(reason: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key in KEYS:
        result[key] = None
        result[f"{key}_reason"] = reason
    result["sweep"] = []
    return result


def _timed_read(engine: Any, pump: Callable[[], None], args: tuple[Any, ...]) -> int:
    """Post one batch, poll it to completion; elapsed nanoseconds."""
    start = time.perf_counter_ns()
    handle = engine.post(*args, "bench-sweep")
    while (status := engine.poll(handle)).state is TransferState.IN_PROGRESS:
        pump()
    elapsed = time.perf_counter_ns() - start
    engine.release(handle)
    if status.state is not TransferState.SUCCEEDED:
        raise RuntimeError(f"sweep transfer failed: {status.state.value} {status.message}")
    return elapsed


def block_size_sweep(
    *, sizes: Sequence[int] = SWEEP_SIZES, total_bytes: int = 32 << 20, repeats: int = 3
) -> list[dict[str, Any]]:
    """READ ``total_bytes`` in randomly ordered blocks of each size; GB/s next to a gather."""
    from moriio.adapters.nixl import NixlTransferEngine

    rng = np.random.default_rng(0)
    source = rng.integers(0, 256, total_bytes, dtype=np.uint8)
    dest = np.ones(total_bytes, dtype=np.uint8)
    target = NixlTransferEngine(loopback=True)
    engine = NixlTransferEngine(loopback=True)
    rows: list[dict[str, Any]] = []
    try:
        t_region = target.register_region(source.ctypes.data, total_bytes)
        local = engine.register_region(dest.ctypes.data, total_bytes)
        remote = engine.import_region(engine.add_peer(target.metadata()), t_region.descriptor)
        for size in sizes:
            n = total_bytes // size
            perm = rng.permutation(n).astype(np.int64)
            blocks = np.arange(n, dtype=np.int64) * size
            args = (
                TransferOp.READ,
                local,
                remote,
                blocks,
                perm * size,
                np.full(n, size, dtype=np.int64),
            )
            dest.fill(0)
            _timed_read(engine, target.progress, args)
            src2d, dst2d = source[: n * size].reshape(n, size), dest[: n * size].reshape(n, size)
            if not np.array_equal(dst2d, src2d[perm]):
                raise RuntimeError(f"sweep READ of {size}-byte blocks moved the wrong bytes")
            samples = [_timed_read(engine, target.progress, args) for _ in range(repeats)]
            gather = []
            for _ in range(repeats):
                start = time.perf_counter_ns()
                np.take(src2d, perm, axis=0, out=dst2d, mode="clip")  # unbuffered
                gather.append(time.perf_counter_ns() - start)
            nbytes = n * size
            rows.append(
                {
                    "block_size": size,
                    "num_blocks": n,
                    "gbps": nbytes / statistics.median(samples),
                    "memcpy_gbps": nbytes / statistics.median(gather),
                }
            )
    finally:
        engine.close()
        target.close()
    return rows


def measure_transport(
    *,
    num_blocks: int = 1024,
    block_size: int = 64 * 1024,
    repeats: int = 5,
    latency_iterations: int = 500,
    sweep_sizes: Sequence[int] = SWEEP_SIZES,
    sweep_total_bytes: int = 32 << 20,
    two_processes: bool = True,
) -> dict[str, Any]:
    """The ``transport`` section of ``moriio bench`` (nulls with reasons without NIXL)."""
    try:
        from moriio_tools.bench.nixl_engine import run_transport_benchmark

        base = run_transport_benchmark(
            num_blocks=num_blocks,
            block_size=block_size,
            repeats=repeats,
            latency_sizes=(4096, 64 * 1024),
            latency_iterations=latency_iterations,
            two_processes=two_processes,
        )
    except (ImportError, TransferEngineError) as exc:
        return _nulls(f"NIXL unavailable: {exc}")
    result: dict[str, Any] = {
        "engine": "nixl",
        "op": "read",
        "order": "sequential",
        "gbps": base["read_sequential_gbps"],
        "memcpy_gbps": base["memcpy_gbps"],
        "ratio": base["read_sequential_ratio"],
        "permuted_gbps": base["read_permuted_gbps"],
        "permuted_ratio": base["read_permuted_ratio"],
        "latency_bytes": 4096,
        "latency_us_p50": base["latency_4096_p50_us"],
        "latency_us_p99": base["latency_4096_p99_us"],
        "target_ratio": TARGET_RATIO,
    }
    result.update({k: v for k, v in base.items() if k not in result})
    try:
        result["sweep"] = block_size_sweep(sizes=sweep_sizes, total_bytes=sweep_total_bytes)
    except (RuntimeError, TransferEngineError) as exc:
        result["sweep"] = []
        result["sweep_reason"] = str(exc)
    result["sweep_total_bytes"] = sweep_total_bytes
    return result
