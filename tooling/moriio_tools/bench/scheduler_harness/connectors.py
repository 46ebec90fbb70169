"""The connectors the harness times: the shape-matched no-op floor and the method timer."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from vllm.config import (
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.request import Request, RequestStatus

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks

KVRole = Literal["kv_consumer", "kv_producer"]
BLOCK_SIZE = 16
VOCAB = 1000
PROMPT_TOKENS = (512, 2048)
CONSUMER_OUTPUT_TOKENS = (32, 256)
TRANSFER_STEPS = 4
FULL_GC_EVERY = 8  # steps; younger generations are collected after every step
MAX_MODEL_LEN = 4096
ROLES = ("consumer_read", "consumer_write", "producer_read", "producer_write")
CONNECTORS: dict[str, tuple[str, str | None]] = {
    "moriio": ("MoriioKVConnector", "moriio.vllm_plugin"),
    "vllm": ("MoRIIOConnector", None),  # vLLM's registry
    "noop": ("ShapeMatchedNoopConnector", "moriio_tools.bench.scheduler_harness.connectors"),
}
# Every scheduler-side method of KVConnectorBase_V1 the v1 Scheduler may call.
SCHEDULER_METHODS = (
    "get_num_new_matched_tokens",
    "get_external_cache_hit_sources",
    "get_loaded_kv_cache_group_ids",
    "update_state_after_alloc",
    "build_connector_meta",
    "on_new_request",
    "update_connector_output",
    "request_finished",
    "request_finished_all_groups",
    "register_finished_partial_tail",
    "take_events",
    "has_pending_block_frees",
    "has_pending_push_work",
    "get_kv_connector_stats",
    "get_finished_count",
)


def split_role(role: str) -> tuple[KVRole, bool]:
    """``"consumer_read"`` -> (``"kv_consumer"``, read_mode=True)."""
    side, _, mode = role.partition("_")
    if side not in ("consumer", "producer") or mode not in ("read", "write"):
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    return ("kv_consumer" if side == "consumer" else "kv_producer"), mode == "read"


# -- the shape-matched floor ---------------------------------------------------------------


class ShapeMatchedNoopConnector(KVConnectorBase_V1):
    """Same scheduling shape as a P/D connector, no bookkeeping at all.

    Consumer READ loads ``prompt - 1`` tokens synchronously, consumer WRITE ``prompt`` tokens
    asynchronously (the fake worker reports them); a length-capped producer request keeps its
    blocks until the fake worker reports ``finished_sending``.
    """

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        kv_config = vllm_config.kv_transfer_config
        assert kv_config is not None
        extra = kv_config.kv_connector_extra_config
        self._read_mode = str(extra.get("read_mode", "false")).lower() in ("true", "1")
        self._producer = kv_config.is_kv_producer

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        params = request.kv_transfer_params
        if self._producer or not params or not params.get("do_remote_prefill"):
            return 0, False
        if self._read_mode:
            return max(request.num_prompt_tokens - 1 - num_computed_tokens, 0), False
        return max(request.num_prompt_tokens - num_computed_tokens, 0), True

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill"):
            params["do_remote_prefill"] = False

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params
        if not (self._producer and params and params.get("do_remote_decode")):
            return False, None
        if request.status != RequestStatus.FINISHED_LENGTH_CAPPED or not block_ids:
            return False, None
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": params.get("transfer_id"),
            "remote_block_ids": [block_ids],
        }

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


# -- timing --------------------------------------------------------------------------------


@dataclass
class StepEvents:
    """What the connector decided during one step (recorded outside the timed region)."""

    async_loads: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)


class ConnectorTimer:
    """Wraps the scheduler-side methods of one connector instance; times outermost calls."""

    def __init__(self, connector: KVConnectorBase_V1) -> None:
        self.step_ns = 0
        self.method_ns: dict[str, int] = defaultdict(int)
        self.method_calls: dict[str, int] = defaultdict(int)
        self.events = StepEvents()
        self._depth = 0
        self._async_match: set[str] = set()
        for name in SCHEDULER_METHODS:
            bound = getattr(connector, name, None)
            if callable(bound):
                setattr(connector, name, self._wrap(name, bound))

    def begin_step(self) -> None:
        self.step_ns = 0
        self.events = StepEvents()

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return method(*args, **kwargs)
            self._depth = 1
            start = clock()
            try:
                result = method(*args, **kwargs)
            finally:
                elapsed = clock() - start
                self._depth = 0
            self.step_ns += elapsed
            self.method_ns[name] += elapsed
            self.method_calls[name] += 1
            self._observe(name, args, result)
            return result

        return timed

    def _observe(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        if name == "get_num_new_matched_tokens":
            request_id = args[0].request_id
            if result[1]:
                self._async_match.add(request_id)
            else:
                self._async_match.discard(request_id)
        elif name == "update_state_after_alloc":
            request_id = args[0].request_id
            if request_id in self._async_match and args[2] > 0:
                self._async_match.discard(request_id)
                self.events.async_loads.append(request_id)
        elif name in ("request_finished", "request_finished_all_groups") and result[0]:
            self.events.held.append(args[0].request_id)
