"""Drive vLLM 0.32's real v1 Scheduler on CPU with a KV connector and time its scheduler side.

Imports vLLM at module load: :mod:`moriio_tools.bench.scheduler` imports this module only once
vLLM is known to be importable. One :func:`run_role` call builds a fresh Scheduler per
connector (tiny local Llama config, block size 16, prefix caching on, enough blocks that
nothing is preempted), keeps ``live`` requests in each, steps them in lockstep and drives
them with a fake worker:

- every scheduled request whose prompt is complete gets one sampled token;
- a KV transfer reports its end 4 steps after it started: ``finished_recving`` for an
  asynchronous consumer load (started in ``update_state_after_alloc``; synchronous READ loads
  never report), ``finished_sending`` for a producer request whose ``request_finished``
  delayed the free of its blocks.

Every scheduler-side connector method is wrapped on the connector instance by
:class:`ConnectorTimer` (outermost call only); ``schedule()`` and ``update_from_output()`` are
timed too. The step's metadata and SchedulerOutput are pickled outside the timed region, and
garbage is collected between steps, never inside a timed call.
:class:`ShapeMatchedNoopConnector` has the same scheduling shape as a real P/D connector and
no bookkeeping: its cost is the floor the harness itself (timer included) adds.
Its builders (:func:`make_vllm_config`, :func:`build_scheduler`, :func:`make_request`, ...)
also make the test suite's simulated engines.
"""

from moriio_tools.bench.scheduler_harness.connectors import (
    BLOCK_SIZE,
    CONNECTORS,
    ROLES,
    SCHEDULER_METHODS,
    ConnectorTimer,
    ShapeMatchedNoopConnector,
    StepEvents,
    split_role,
)
from moriio_tools.bench.scheduler_harness.driver import NotifySink, RoleRun, run_role
from moriio_tools.bench.scheduler_harness.workload import (
    PeerPorts,
    Workload,
    build_scheduler,
    make_kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
    model_output,
    num_blocks_for,
    tiny_model_dir,
)

__all__ = [
    "BLOCK_SIZE",
    "CONNECTORS",
    "ROLES",
    "SCHEDULER_METHODS",
    "ConnectorTimer",
    "NotifySink",
    "PeerPorts",
    "RoleRun",
    "ShapeMatchedNoopConnector",
    "StepEvents",
    "Workload",
    "build_scheduler",
    "make_kv_cache_config",
    "make_request",
    "make_scheduler",
    "make_vllm_config",
    "model_output",
    "num_blocks_for",
    "run_role",
    "split_role",
    "tiny_model_dir",
]
