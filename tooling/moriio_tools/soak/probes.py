"""Engine probes at a quiet point: held blocks and metrics over HTTP, RSS and fds from /proc."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from moriio_tools.serve.deployment import Deployment
from moriio_tools.serve.metrics import Sample, held_blocks, total
from moriio_tools.serve.processes import session_stats
from moriio_tools.soak.records import EngineSample

# The connector exposes counters only (docs/metrics.md): no gauge of peers or ledger sizes.
# These show the peer and transfer state: handshakes grow with every (re)connection, failures,
# teardowns, quarantines and expired leases with every transfer that did not end cleanly.
MORIIO_COUNTERS = (
    "transfers",
    "failed",
    "handshakes",
    "handshake_failures",
    "peer_teardowns",
    "quarantined_blocks",
    "expired_leases",
)


def session_usage(leader: int, proc: Path = Path("/proc")) -> tuple[float, int, int]:
    """RSS in MiB, open descriptors and process count of the session led by ``leader``
    (a server and every process it spawned); processes gone meanwhile count nothing."""
    rss_kib = 0
    fds = 0
    pids = session_stats([leader], proc)
    for pid in pids:
        try:
            status = (proc / str(pid) / "status").read_text()
            fds += len(os.listdir(proc / str(pid) / "fd"))
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss_kib += int(line.split()[1])
    return round(rss_kib / 1024, 1), fds, len(pids)


def moriio_counts(samples: Sequence[Sample]) -> dict[str, int]:
    """:data:`MORIIO_COUNTERS` the engine exposes, cumulative since it started."""
    names = {s.name for s in samples}
    return {
        key: int(total(samples, f"vllm:moriio_{key}_total"))
        for key in MORIIO_COUNTERS
        if f"vllm:moriio_{key}_total" in names
    }


def wait_quiet(
    deployment: Deployment, min_s: float, timeout_s: float
) -> tuple[dict[str, list[Sample]], float]:
    """Every engine's metrics once ``min_s`` passed and none holds a block (or at
    ``timeout_s``), and the seconds it took."""
    started = time.monotonic()
    time.sleep(min_s)
    while True:
        samples = {slot.name: deployment.metrics(slot) for slot in deployment.slots}
        quiet = all(held_blocks(s) == 0 for s in samples.values())
        if quiet or time.monotonic() - started > timeout_s:
            return samples, round(time.monotonic() - started, 1)
        time.sleep(0.5)


def sample_engines(
    deployment: Deployment,
    metrics: Mapping[str, Sequence[Sample]],
    lives: Mapping[str, tuple[int, float]],
    now: float,
) -> tuple[EngineSample, ...]:
    """Every engine's :class:`EngineSample` from its ``metrics`` and its processes;
    ``lives``: each engine's incarnation and the soak time it (re)started, ``now`` the
    soak time."""
    out = []
    for slot in deployment.slots:
        samples = metrics[slot.name]
        pid = deployment.pid_of(slot)
        rss, fds, processes = session_usage(pid) if pid is not None else (0.0, 0, 0)
        incarnation, born = lives[slot.name]
        running = total(samples, "vllm:num_requests_running")
        waiting = total(samples, "vllm:num_requests_waiting")
        out.append(
            EngineSample(
                engine=slot.name,
                incarnation=incarnation,
                up_s=round(now - born, 1),
                held_blocks=held_blocks(samples),
                requests=int(running + waiting),
                rss_mib=rss,
                fds=fds,
                processes=processes,
                moriio=moriio_counts(samples),
            )
        )
    return tuple(out)
