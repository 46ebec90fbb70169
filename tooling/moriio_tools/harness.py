"""The tooling's public entry point: what moriio's tests import of it, vLLM aside.

Re-exports ``vllm serve`` deployments and their processes, the engine processes (one
in-process engine core each, behind a command connection), the HTTP client and the engines'
metrics, prompts and tiny models, the runs behind ``moriio demo`` and ``moriio bench``
(``--e2e``, ``--stepped``, ``--soak``, the bench sections) with their report types, and the
seeded simulation. A few modules are exported whole, as ``*_module`` or by their command's
name, for the tests that replace one of their attributes. Tests under ``tests/`` import the
tooling only from here and from :mod:`moriio_tools.vllm_harness`, the vLLM scheduler harness
(``tests/unit/test_tooling_imports.py``).
"""

from __future__ import annotations

from moriio_tools.bench.scheduler import ROLES as SCHEDULER_ROLES
from moriio_tools.bench.scheduler import measure_scheduler
from moriio_tools.cli import demo as demo_command
from moriio_tools.engines.engine_process import EngineError, EngineProcess, stop_all
from moriio_tools.engines.protocol import (
    ENGINE_ENV,
    ConnectorRef,
    EngineSnapshot,
    EngineSpec,
    Finished,
    KVRole,
    Submit,
    TransferSpan,
    connector_config,
)
from moriio_tools.engines.spans import SpanRecorder, busy_seconds, percentile
from moriio_tools.models import zoo_model
from moriio_tools.models.llama import TinyLlama
from moriio_tools.models.store import ensure_model
from moriio_tools.prompts import SPECIAL_LENGTHS, Prompt, build_prompts
from moriio_tools.serve import runner as demo_runner_module
from moriio_tools.serve import summary as demo_summary_module
from moriio_tools.serve.client import Completion, complete, completion_body, run_batch
from moriio_tools.serve.deployment import Deployment, EngineSlot
from moriio_tools.serve.e2e import E2EConfig, run_e2e
from moriio_tools.serve.e2e_report import BASELINE as E2E_BASELINE
from moriio_tools.serve.e2e_report import aggregate
from moriio_tools.serve.metrics import (
    CACHED,
    COMPUTED,
    LOADED,
    Sample,
    held_blocks,
    parse,
    prompt_kv_shortfall,
    prompt_tokens_by_source,
    since,
    total,
)
from moriio_tools.serve.nixl_proxy import NixlProxy
from moriio_tools.serve.nixl_shim import write_nixl_shim
from moriio_tools.serve.peer_proxy import PeerProxy
from moriio_tools.serve.processes import (
    ManagedProcess,
    ephemeral_floor,
    free_ports,
    http_get,
    vllm_router_binary,
    vllm_router_process,
    vllm_server,
)
from moriio_tools.serve.runner import (
    Progress,
    ServeDemoConfig,
    baseline,
    prepare_model,
    reference,
    run_mode,
)
from moriio_tools.serve.vllm_bench import SweepConfig
from moriio_tools.sim import SimConfig, Simulation, Violation, run_seeds, seeded_workload
from moriio_tools.sim import checks as sim_checks_module
from moriio_tools.sim.__main__ import main as sim_main
from moriio_tools.sim.config import RunResult, Worker
from moriio_tools.sim.invariants import (
    BlockPool,
    BufferReading,
    InvariantViolationError,
    check_all_free,
    check_buffers,
    check_deadline,
    check_listeners,
    check_load_errors,
)
from moriio_tools.sim.report import SimReport
from moriio_tools.sim.requests import Outcome
from moriio_tools.sim.run import EARLY_RELEASE
from moriio_tools.sim.workload import AbortPoint, NodeFault, Workload
from moriio_tools.soak.config import ROLES as SOAK_ROLES
from moriio_tools.soak.config import SoakConfig
from moriio_tools.soak.report import header as soak_header
from moriio_tools.soak.report import interval_rows
from moriio_tools.soak.report import summary as soak_summary
from moriio_tools.soak.runner import run_soak
from moriio_tools.soak.verdict import slope_failures
from moriio_tools.stepped.bench import BASELINE as STEPPED_BASELINE
from moriio_tools.stepped.bench import DEFAULT_CASES as STEPPED_CASES
from moriio_tools.stepped.bench import PEER as STEPPED_PEER
from moriio_tools.stepped.bench import SteppedConfig, run_stepped
from moriio_tools.stepped.pair import STEPPED_CONNECTORS

__all__ = [
    # processes, deployments, the client and the engines' metrics
    "CACHED",
    "COMPUTED",
    "LOADED",
    "Completion",
    "Deployment",
    "EngineSlot",
    "ManagedProcess",
    "NixlProxy",
    "PeerProxy",
    "Sample",
    "complete",
    "completion_body",
    "ephemeral_floor",
    "free_ports",
    "held_blocks",
    "http_get",
    "parse",
    "prompt_kv_shortfall",
    "prompt_tokens_by_source",
    "run_batch",
    "since",
    "total",
    "vllm_router_binary",
    "vllm_router_process",
    "vllm_server",
    "write_nixl_shim",
    # engine processes (in-process engine cores behind a command connection)
    "ENGINE_ENV",
    "ConnectorRef",
    "EngineError",
    "EngineProcess",
    "EngineSnapshot",
    "EngineSpec",
    "Finished",
    "KVRole",
    "SpanRecorder",
    "Submit",
    "TransferSpan",
    "busy_seconds",
    "connector_config",
    "percentile",
    "stop_all",
    # prompts and models
    "SPECIAL_LENGTHS",
    "Prompt",
    "TinyLlama",
    "build_prompts",
    "ensure_model",
    "zoo_model",
    # moriio demo
    "Progress",
    "ServeDemoConfig",
    "baseline",
    "demo_command",
    "demo_runner_module",
    "demo_summary_module",
    "prepare_model",
    "reference",
    "run_mode",
    # moriio bench: sections, --e2e, --stepped, --soak
    "E2E_BASELINE",
    "SCHEDULER_ROLES",
    "SOAK_ROLES",
    "STEPPED_BASELINE",
    "STEPPED_CASES",
    "STEPPED_CONNECTORS",
    "STEPPED_PEER",
    "E2EConfig",
    "SoakConfig",
    "SteppedConfig",
    "SweepConfig",
    "aggregate",
    "interval_rows",
    "measure_scheduler",
    "run_e2e",
    "run_soak",
    "run_stepped",
    "slope_failures",
    "soak_header",
    "soak_summary",
    # the simulation
    "EARLY_RELEASE",
    "AbortPoint",
    "BlockPool",
    "BufferReading",
    "InvariantViolationError",
    "NodeFault",
    "Outcome",
    "RunResult",
    "SimConfig",
    "SimReport",
    "Simulation",
    "Violation",
    "Worker",
    "Workload",
    "check_all_free",
    "check_buffers",
    "check_deadline",
    "check_listeners",
    "check_load_errors",
    "run_seeds",
    "seeded_workload",
    "sim_checks_module",
    "sim_main",
]
