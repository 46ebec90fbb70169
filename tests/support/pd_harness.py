"""A prefill engine and a decode engine made of vLLM's real Scheduler and our connector.

* :mod:`support.pd_engine` -- :class:`SimEngine`: one engine with a simulated forward whose KV
  is a deterministic function of the tokens, so the decode can check every loaded byte;
* :mod:`support.pd_worlds` -- :class:`InMemoryWorld` (the in-memory fakes and their fault
  knobs) and :class:`NixlWorld` (real NIXL agents and ZMQ channels on 127.0.0.1);
* :mod:`support.pd_proxy` -- :class:`PDProxy` (routes like vLLM's MoRIIO toy proxy),
  :func:`build_pd`, random workloads and :func:`drive` (waves at a fixed concurrency).
"""

from support.pd_engine import LAYERS, EngineStats, SimEngine, block_pattern
from support.pd_proxy import (
    PDProxy,
    Workload,
    build_pd,
    drive,
    engine_extra,
    new_transfer_id,
    random_workload,
)
from support.pd_worlds import HOST, InMemoryWorld, NixlWorld, Ports, World, free_tcp_port

__all__ = [
    "HOST",
    "LAYERS",
    "EngineStats",
    "InMemoryWorld",
    "NixlWorld",
    "PDProxy",
    "Ports",
    "SimEngine",
    "Workload",
    "World",
    "block_pattern",
    "build_pd",
    "drive",
    "engine_extra",
    "free_tcp_port",
    "new_transfer_id",
    "random_workload",
]
