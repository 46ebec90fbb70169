"""What a pair's engines cost over an interval: CPU, run-queue waits and wake-ups per thread.

A :class:`PairUsage` samples every thread of both engine processes
(:mod:`moriio_tools.engines.threads`) when it starts and when it stops, with the threads
named as each engine's interpreter names them (the connector's own threads:
``moriio-progress``, ``moriio-zmq-listener-*``, NixlConnector's ``nixl_handshake_listener``...)
or by the kernel (``ZMQbg/IO/0``, ``gloo_tcp_loop``, ``python`` for unnamed ones). Threads of
one name are summed (``gloo_tcp_loop`` x13).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from moriio_tools.engines import threads
from moriio_tools.engines.protocol import EngineSnapshot, Ready

_TID = re.compile(r"\[\d+\]$")


class Probed(Protocol):
    @property
    def ready(self) -> Ready | None: ...

    def snapshot(self, settle_timeout_s: float = 10.0) -> EngineSnapshot: ...


@dataclass(frozen=True, slots=True)
class ThreadGroup:
    """The threads of one name in one engine, over an interval (per second)."""

    name: str
    count: int
    cpu: float
    wait: float
    wakeups_per_s: float
    preempted_per_s: float


@dataclass(frozen=True, slots=True)
class EngineUsage:
    """One engine process over ``seconds``: its threads' sums per second, and by name."""

    seconds: float
    cpu: float  # cores busy
    wait: float  # threads runnable but waiting for a core, on average
    wakeups_per_s: float  # voluntary context switches: blocked, then woken
    preempted_per_s: float  # involuntary ones
    groups: tuple[ThreadGroup, ...]  # busiest first

    def figures(self) -> dict[str, float]:
        return {
            "cpu": self.cpu,
            "wait": self.wait,
            "wakeups_per_s": self.wakeups_per_s,
            "preempted_per_s": self.preempted_per_s,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            **self.figures(),
            "threads": [
                {
                    "name": g.name,
                    "count": g.count,
                    "cpu": g.cpu,
                    "wait": g.wait,
                    "wakeups_per_s": g.wakeups_per_s,
                    "preempted_per_s": g.preempted_per_s,
                }
                for g in self.groups
            ],
        }


def engine_usage(rows: list[threads.ThreadUsage], seconds: float) -> EngineUsage:
    process = threads.summarize(rows, seconds)
    span = max(seconds, 1e-9)
    named: dict[str, list[threads.ThreadUsage]] = {}
    for row in rows:
        named.setdefault(_TID.sub("", row.name), []).append(row)
    groups = sorted(
        (
            ThreadGroup(
                name=name,
                count=len(members),
                cpu=sum(m.cpu_s for m in members) / span,
                wait=sum(m.wait_s for m in members) / span,
                wakeups_per_s=sum(m.wakeups for m in members) / span,
                preempted_per_s=sum(m.preempted for m in members) / span,
            )
            for name, members in named.items()
        ),
        key=lambda g: (-g.cpu, -g.wakeups_per_s, g.name),
    )
    return EngineUsage(
        seconds=seconds,
        cpu=process.cpu,
        wait=process.wait,
        wakeups_per_s=process.wakeups_per_s,
        preempted_per_s=process.preempted_per_s,
        groups=tuple(groups),
    )


class PairUsage:
    """Samples the engines of a pair (role -> engine) between :meth:`start` and
    :meth:`stop`."""

    def __init__(self, engines: Mapping[str, Probed]) -> None:
        self._engines = dict(engines)
        self._pids = {}
        for role, engine in self._engines.items():
            if engine.ready is None:
                raise ValueError(f"engine {role} is not running")
            self._pids[role] = engine.ready.pid
        self._names: dict[str, dict[int, str]] = {}
        self._before: dict[str, dict[int, threads.ThreadCounters]] = {}
        self._started = 0.0

    def start(self) -> None:
        """Name the threads (the engines answer between steps), then sample them."""
        self._names = {
            role: engine.snapshot(settle_timeout_s=0.0).threads
            for role, engine in self._engines.items()
        }
        self._before = {role: threads.sample(pid) for role, pid in self._pids.items()}
        self._started = time.monotonic()

    def stop(self) -> dict[str, EngineUsage]:
        seconds = time.monotonic() - self._started
        out = {}
        for role, pid in self._pids.items():
            after = threads.sample(pid)
            rows = threads.usage(pid, self._before[role], after, self._names.get(role))
            out[role] = engine_usage(rows, seconds)
        return out
