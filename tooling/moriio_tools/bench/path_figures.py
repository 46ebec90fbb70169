"""This host's figures for the path cost model (``moriio bench --paths``), over NIXL loopback.

Two NIXL engines in this process move host memory (UCX's CMA, as two engines of one host do):

- ``per_descriptor``: a READ of ``n`` scattered 4 KiB descriptors against one descriptor of
  the same bytes, the difference over ``n - 1``;
- ``per_post``: a one-descriptor READ of 64 bytes, posted and polled to its end, less one
  descriptor;
- ``link_bandwidth``: a contiguous READ of ``total_bytes`` (one descriptor);
- ``copy_bandwidth``: ``np.copyto`` of the same bytes (what a gather or scatter costs per
  byte on the host);
- ``per_segment``: :class:`~moriio.adapters.host_copies.HostSegmentCopier` gathering ``n``
  scattered 4 KiB segments, less their bytes at ``copy_bandwidth``, over ``n``.

Each is the median of ``repeats`` rounds. The result's ``figures`` object is what
``moriio plan --figures`` reads (``host/local``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from moriio.domain.kv.path_costs import DEFAULT_FIGURES, FIGURE_FIELDS, figure_name
from moriio.ports import MemoryKind, TransferOp, TransferState

SEGMENT = 4096


def _median_ns(run: Callable[[], object], repeats: int) -> float:
    run()  # warm: page faults, UCX wire-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        run()
        samples.append(time.perf_counter_ns() - start)
    return float(statistics.median(samples))


def measure_path_figures(
    *, total_bytes: int = 32 << 20, descriptors: int = 4096, repeats: int = 5
) -> dict[str, Any]:
    """Measure the ``host/local`` figures; the result names each raw measurement too."""
    from moriio.adapters.host_copies import HostSegmentCopier
    from moriio.adapters.nixl import NixlTransferEngine

    n = min(descriptors, total_bytes // SEGMENT)
    rng = np.random.default_rng(0)
    source = rng.integers(0, 256, total_bytes, dtype=np.uint8)
    dest = np.zeros(total_bytes, dtype=np.uint8)
    target = NixlTransferEngine(loopback=True)
    engine = NixlTransferEngine(loopback=True)
    try:
        t_region = target.register_region(source.ctypes.data, total_bytes)
        local = engine.register_region(dest.ctypes.data, total_bytes)
        remote = engine.import_region(engine.add_peer(target.metadata()), t_region.descriptor)

        def read(lo: np.ndarray, ro: np.ndarray, sizes: np.ndarray) -> Callable[[], None]:
            def run() -> None:
                handle = engine.post(TransferOp.READ, local, remote, lo, ro, sizes, "paths")
                while (status := engine.poll(handle)).state is TransferState.IN_PROGRESS:
                    target.progress()
                engine.release(handle)
                if status.state is not TransferState.SUCCEEDED:
                    raise RuntimeError(f"path figures: READ failed: {status.message}")

            return run

        # Every other 4 KiB slot, in random order: nothing merges.
        slots = rng.permutation(n).astype(np.int64) * 2 * SEGMENT % total_bytes
        scattered = (slots, slots[::-1].copy(), np.full(n, SEGMENT, dtype=np.int64))
        whole = tuple(np.array([v], dtype=np.int64) for v in (0, 0, n * SEGMENT))
        small = tuple(np.array([v], dtype=np.int64) for v in (0, 0, 64))
        many_ns = _median_ns(read(*scattered), repeats)
        one_ns = _median_ns(read(*whole), repeats)
        post_ns = _median_ns(read(*small), repeats * 20)
        contiguous = tuple(np.array([v], dtype=np.int64) for v in (0, 0, total_bytes))
        link_ns = _median_ns(read(*contiguous), repeats)
        copy_ns = _median_ns(lambda: np.copyto(dest, source), repeats)
        copier = HostSegmentCopier()
        src_region = t_region  # both regions live in this process
        gather_ns = _median_ns(
            lambda: copier.copy(local, src_region, scattered[0], scattered[1], scattered[2]),
            repeats,
        )
    finally:
        engine.close()
        target.close()
    per_descriptor = max(many_ns - one_ns, 0.0) / (n - 1) / 1e9
    copy_bw = total_bytes / (copy_ns / 1e9)
    per_segment = max(gather_ns / 1e9 - n * SEGMENT / copy_bw, 0.0) / n
    figures = {
        "per_post": max(post_ns / 1e9 - per_descriptor, 0.0),
        "per_descriptor": per_descriptor,
        "link_bandwidth": total_bytes / (link_ns / 1e9),
        "copy_bandwidth": copy_bw,
        "per_segment": per_segment,
    }
    name = figure_name((MemoryKind.HOST, True))
    default = DEFAULT_FIGURES[(MemoryKind.HOST, True)]
    return {
        "figures": {name: figures},
        "defaults": {name: {field: getattr(default, field) for field in FIGURE_FIELDS}},
        "measured": {
            "descriptors": n,
            "segment_bytes": SEGMENT,
            "total_bytes": total_bytes,
            "scattered_read_us": many_ns / 1e3,
            "one_descriptor_read_us": one_ns / 1e3,
            "small_read_us": post_ns / 1e3,
            "contiguous_read_us": link_ns / 1e3,
            "memcpy_us": copy_ns / 1e3,
            "host_gather_us": gather_ns / 1e3,
        },
    }


def render_path_figures(data: dict[str, Any]) -> str:
    """Each measured figure next to its documented default."""
    lines = []
    for name, figures in data["figures"].items():
        default = data["defaults"][name]
        lines.append(f"path figures, {name} (NIXL loopback, this host; default in brackets):")
        for field in FIGURE_FIELDS:
            unit, scale = ("GB/s", 1e-9) if field.endswith("bandwidth") else ("us", 1e6)
            lines.append(
                f"  {field:15} {figures[field] * scale:10.3f} {unit}"
                f"  [{default[field] * scale:.3f} {unit}]"
            )
    m = data["measured"]
    lines.append(
        f"  from {m['descriptors']} scattered {m['segment_bytes']} B descriptors in "
        f"{m['scattered_read_us']:.0f} us against one in {m['one_descriptor_read_us']:.0f} us"
    )
    return "\n".join(lines)
