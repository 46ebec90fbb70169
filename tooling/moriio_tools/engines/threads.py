"""What every thread of a process costs, from ``/proc``: CPU, run-queue waits, wake-ups.

Per thread (``/proc/PID/task/TID``): ``schedstat`` gives the nanoseconds it ran on a core
and the nanoseconds it waited, runnable, for one (the cost of sharing cores); ``status``
gives its voluntary context switches (it blocked, and was woken again: wake-ups) and
involuntary ones (it was preempted). Two samples of a process make a
:class:`ThreadUsage` per thread over the interval between them; threads started in between
count from zero, threads gone in between are lost with their counts (a process's
short-lived threads may be under-counted).

Threads are named by ``labels`` (thread id -> name, e.g. the Python names a process
reports) and otherwise by their kernel name (``comm``), which native libraries set (ZMQ's
``ZMQbg/IO/0``) and Python 3.11 does not (``python``); the process's main thread is
``main``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

NS = 1e-9


@dataclass(frozen=True, slots=True)
class ThreadCounters:
    """One thread's cumulative counters at one moment."""

    tid: int
    comm: str
    run_ns: int  # on a core
    wait_ns: int  # runnable, waiting for a core
    voluntary: int  # blocked and woken again
    involuntary: int  # preempted


@dataclass(frozen=True, slots=True)
class ThreadUsage:
    """One thread over an interval."""

    name: str
    cpu_s: float
    wait_s: float
    wakeups: int
    preempted: int


def sample(pid: int, proc: Path = Path("/proc")) -> dict[int, ThreadCounters]:
    """Every thread of ``pid`` now (threads that end while being read are skipped; an
    ended process gives none)."""
    out: dict[int, ThreadCounters] = {}
    try:
        tids = [int(p.name) for p in (proc / str(pid) / "task").iterdir() if p.name.isdigit()]
    except OSError:
        return out
    for tid in tids:
        counters = _thread(proc / str(pid) / "task" / str(tid), tid)
        if counters is not None:
            out[tid] = counters
    return out


def _thread(task: Path, tid: int) -> ThreadCounters | None:
    try:
        schedstat = (task / "schedstat").read_text().split()
        status = (task / "status").read_text()
        comm = (task / "comm").read_text().strip()
    except OSError:
        return None
    switches = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in switches:
            switches[key] = int(value)
    return ThreadCounters(
        tid=tid,
        comm=comm,
        run_ns=int(schedstat[0]),
        wait_ns=int(schedstat[1]),
        voluntary=switches["voluntary_ctxt_switches"],
        involuntary=switches["nonvoluntary_ctxt_switches"],
    )


def usage(
    pid: int,
    before: Mapping[int, ThreadCounters],
    after: Mapping[int, ThreadCounters],
    labels: Mapping[int, str] | None = None,
) -> list[ThreadUsage]:
    """Per thread of ``pid`` alive at ``after``: what it used since ``before``, busiest
    first."""
    names = dict(labels or {})
    rows = []
    for tid, now in after.items():
        then = before.get(tid)
        if then is None or then.run_ns > now.run_ns:  # started in between (or id reused)
            then = ThreadCounters(tid, now.comm, 0, 0, 0, 0)
        name = "main" if tid == pid else names.get(tid, now.comm)
        rows.append(
            ThreadUsage(
                name=f"{name}[{tid}]",
                cpu_s=(now.run_ns - then.run_ns) * NS,
                wait_s=(now.wait_ns - then.wait_ns) * NS,
                wakeups=now.voluntary - then.voluntary,
                preempted=now.involuntary - then.involuntary,
            )
        )
    return sorted(rows, key=lambda r: (-r.cpu_s, -r.wakeups, r.name))


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """A process over an interval of ``seconds``: its threads' sums, per second."""

    seconds: float
    cpu: float  # cores busy
    wait: float  # runnable threads waiting for a core, on average
    wakeups_per_s: float
    preempted_per_s: float
    threads: tuple[ThreadUsage, ...]


def summarize(threads: Iterable[ThreadUsage], seconds: float) -> ProcessUsage:
    rows = tuple(threads)
    span = max(seconds, 1e-9)
    return ProcessUsage(
        seconds=seconds,
        cpu=sum(r.cpu_s for r in rows) / span,
        wait=sum(r.wait_s for r in rows) / span,
        wakeups_per_s=sum(r.wakeups for r in rows) / span,
        preempted_per_s=sum(r.preempted for r in rows) / span,
        threads=rows,
    )
