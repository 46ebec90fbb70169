"""What the orchestrator and an engine process say to each other over their connection.

Both ends are this package on one host (the engine dials back to a listener the orchestrator
opened, with a per-process key), so plain picklable frozen dataclasses suffice: nothing here
crosses a machine boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]

IN_PROCESS_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # scheduler, worker and connector in one process
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per engine
    "HF_HUB_OFFLINE": "1",
}
"""What every engine process needs in its environment, on top of the orchestrator's."""

ENGINE_ENV = {**IN_PROCESS_ENV, "UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib"}
"""The default environment: NIXL's UCX on the loopback device only."""


@dataclass(frozen=True, slots=True)
class ConnectorRef:
    """A KV connector class as vLLM loads it: class name and importable module path."""

    class_name: str = "MoriioKVConnector"
    module_path: str = "moriio.vllm_plugin"


def connector_config(
    kv_role: KVRole, extra_config: dict[str, Any], connector: ConnectorRef = ConnectorRef()
) -> dict[str, Any]:
    """The ``kv_transfer_config`` of an engine running ``connector`` (moriio's by default)."""
    return {
        "kv_connector": connector.class_name,
        "kv_connector_module_path": connector.module_path,
        "kv_role": kv_role,
        "kv_connector_extra_config": dict(extra_config),
    }


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """How to start one engine process.

    ``kv_transfer_config`` is what ``vllm serve --kv-transfer-config`` takes (None: a plain
    engine). ``stepping``: ``"when-busy"`` steps while the scheduler has work and otherwise
    waits on the connection; ``"engine-core"`` steps as vLLM's engine core does
    (``EngineCore.run_busy_loop``: while it has work, including finished requests whose
    blocks a connector still holds, with 1 ms between steps that run no model).
    """

    name: str
    kv_transfer_config: dict[str, Any] | None
    log_path: str | None = None
    model_dir: str | None = None  # None: the tiny Llama, built under model_cache_dir if missing
    model_cache_dir: str | None = None  # None: :func:`moriio_tools.models.store.default_cache_dir`
    env: dict[str, str] = field(default_factory=lambda: dict(ENGINE_ENV))
    cores: tuple[int, ...] = ()  # every thread of the engine on these cores; (): unpinned
    block_size: int = 32
    max_model_len: int = 1024
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048  # vllm serve's default here (the LLM class's is 4096)
    log_stats: bool = False  # vLLM's periodic stats (on in vllm serve, off in the LLM class)
    idle_wait_s: float = 0.001  # connection wait between steps while only transfers are pending
    stepping: Literal["when-busy", "engine-core"] = "when-busy"
    report_first_tokens: bool = False  # send a FirstToken event as each request starts


# -- orchestrator -> engine -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    """One greedy request (``key`` is unique per engine run)."""

    key: str
    prompt: tuple[int, ...]
    max_tokens: int
    kv_transfer_params: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SubmitBatch:
    requests: tuple[Submit, ...]


@dataclass(frozen=True, slots=True)
class TakeSnapshot:
    """Reply with an :class:`EngineSnapshot` (after stepping until idle when ``settle``)."""

    settle_timeout_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ResetPrefixCache:
    """Step until idle, then drop the prefix cache; replies with :class:`Reply`."""

    timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


Command = SubmitBatch | TakeSnapshot | ResetPrefixCache | Shutdown

# -- engine -> orchestrator -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    name: str
    startup_s: float
    num_blocks: int
    pid: int
    model_dir: str


@dataclass(frozen=True, slots=True)
class FirstToken:
    """A request's first output token (with :attr:`EngineSpec.report_first_tokens`)."""

    key: str
    wall_time: float  # time.time() in the engine process


@dataclass(frozen=True, slots=True)
class Finished:
    """A request ended; ``kv_transfer_params`` is what the connector returned for it."""

    key: str
    token_ids: tuple[int, ...]
    kv_transfer_params: dict[str, Any] | None
    finish_reason: str | None
    wall_time: float = 0.0  # time.time() in the engine process


@dataclass(frozen=True, slots=True)
class TransferSpan:
    """One transfer as seen by the side that posted it (READ: decode, WRITE: prefill)."""

    transfer_id: str
    start: float  # monotonic seconds: first batch posted
    end: float  # monotonic seconds: last batch seen terminal
    bytes: int
    batches: int
    ok: bool


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """Block usage and connector counters of one engine."""

    name: str
    free_blocks: int
    usable_blocks: int  # every block but vLLM's null block
    scheduler_requests: int  # requests still known to the scheduler (running or held)
    counters: dict[str, int]
    failures_by_kind: dict[str, int]
    transfers: tuple[TransferSpan, ...]
    settled: bool  # the scheduler was idle when the snapshot was taken
    # prompt tokens per source since the engine started (vLLM's prefill stats): loaded by the
    # connector, found in the prefix cache, computed
    prompt_sources: dict[str, int] = field(default_factory=dict)
    loaded_requests: int = 0  # requests with some prompt KV loaded by the connector
    threads: dict[int, str] = field(default_factory=dict)  # thread id -> its Python name

    @property
    def held_blocks(self) -> int:
        return self.usable_blocks - self.free_blocks


@dataclass(frozen=True, slots=True)
class Reply:
    ok: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine process hit an exception; it exits after sending this."""

    error: str


Event = Ready | FirstToken | Finished | EngineSnapshot | Reply | Failed
