"""How the engines of a stepped pair meet the host's cores: the configurations users run.

vLLM's in-process engine binds nothing and lets torch pick its OpenMP threads (one per core),
so its default puts both engines of a pair on every core, each with as many OpenMP threads as
there are cores; ``vllm serve``'s workers bind by ``VLLM_CPU_OMP_THREADS_BIND``. Each
:class:`Binding` says what one engine of ``count`` on this host gets: the cores it is pinned
to (a ``VLLM_CPU_OMP_THREADS_BIND``-style list; ``nobind``: none) and what its environment
sets. Whatever the bench's own environment sets (``OMP_NUM_THREADS``...) the engines inherit
unless a binding sets it: :func:`inherited` names it for the report.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from moriio_tools.serve.processes import engine_cpu_binds

THREAD_SETTINGS = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "OMP_WAIT_POLICY", "LD_PRELOAD")


@dataclass(frozen=True, slots=True)
class EngineBinding:
    cores: str  # "0", "0,1", "nobind"
    env: dict[str, str]


@dataclass(frozen=True, slots=True)
class Binding:
    name: str
    header: str  # what a table measured in this configuration says it is
    engines: Callable[[int], list[EngineBinding]]


def _unbound(threads: int | None, **env: str) -> Callable[[int], list[EngineBinding]]:
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return lambda count: [EngineBinding("nobind", dict(env)) for _ in range(count)]


def _own_cores(count: int) -> list[EngineBinding]:
    return [EngineBinding(cores, {}) for cores in engine_cpu_binds(count)]


def _cores() -> int:
    return len(os.sched_getaffinity(0))


BINDINGS: dict[str, Binding] = {
    b.name: b
    for b in (
        Binding(
            "vllm-defaults",
            "vLLM's defaults: nothing set; every engine unbound, with the OpenMP threads "
            f"torch picks (one per core: {_cores()})",
            _unbound(None),
        ),
        Binding(
            "defaults-passive",
            "vLLM's defaults, but OpenMP threads that sleep while they wait "
            "(OMP_WAIT_POLICY=PASSIVE): the one setting that stops two engines' threads "
            "spinning on the cores they share",
            _unbound(None, OMP_WAIT_POLICY="PASSIVE"),
        ),
        Binding(
            "unbound-2",
            "engines unbound, two OpenMP threads each (OMP_NUM_THREADS=2)",
            _unbound(2),
        ),
        Binding(
            "unbound-1",
            "engines unbound, one OpenMP thread each (OMP_NUM_THREADS=1)",
            _unbound(1),
        ),
        Binding(
            "own-cores",
            "each engine pinned to its own cores, one OpenMP thread per core "
            "(the served deployments' engine_cpu_binds)",
            _own_cores,
        ),
    )
}
DEFAULT_BINDINGS = tuple(BINDINGS)


def inherited() -> dict[str, str]:
    """The thread settings this process's environment gives every engine it starts."""
    return {k: os.environ[k] for k in THREAD_SETTINGS if k in os.environ}
