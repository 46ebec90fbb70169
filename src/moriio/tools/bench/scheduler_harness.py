"""Drive vLLM 0.32's real v1 Scheduler on CPU with a KV connector and time its scheduler side.

Imports vLLM at module load: :mod:`moriio.tools.bench.scheduler` imports this module only once
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
"""

from __future__ import annotations

import gc
import os
import pickle
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import zmq
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

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
    "noop": ("ShapeMatchedNoopConnector", "moriio.tools.bench.scheduler_harness"),
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


# -- the workload --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerPorts:
    """Control addresses embedded in request ids (the prefill notify port is a live ROUTER)."""

    prefill_handshake: int
    prefill_notify: int
    decode_handshake: int
    decode_notify: int

    def request_id(self, suffix: str) -> str:
        prefill = f"host:127.0.0.1,handshake:{self.prefill_handshake},notify:{self.prefill_notify}"
        decode = f"host:127.0.0.1,handshake:{self.decode_handshake},notify:{self.decode_notify}"
        return f"___prefill_addr_{prefill}___decode_addr_{decode}_{suffix}"


def residual_output_tokens(rng: np.random.Generator) -> int:
    """Tokens a steadily decoding request still has to generate (length-biased residual).

    Output lengths are uniform on [lo, hi]; the residual of a request caught mid-decode has
    density proportional to P(length > r): flat on [1, lo], then falling linearly to hi.
    """
    lo, hi = CONSUMER_OUTPUT_TOKENS
    flat = lo / (lo + (hi - lo) / 2)
    if rng.random() < flat:
        return int(rng.integers(1, lo + 1))
    return round(rng.triangular(lo, lo, hi))


class Workload:
    """The same seeded request sequence for every connector: prompts, lengths, params."""

    def __init__(self, role: str, seed: int, ports: PeerPorts) -> None:
        self._kv_role, self._read = split_role(role)
        self._rng = np.random.default_rng(seed)
        self._ports = ports
        self._remote_blocks = 1 << 20
        self.hasher = get_request_block_hasher(BLOCK_SIZE, sha256)

    def next_request(self, *, initial: bool = False) -> Request:
        """The next request; ``initial`` requests fill an empty scheduler at once and
        stand in for a steady population: a consumer's output length is drawn from the
        remaining-length distribution of requests already decoding."""
        rng = self._rng
        prompt_len = int(rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1))
        prompt = rng.integers(0, VOCAB, size=prompt_len).tolist()
        request_id = self._ports.request_id(rng.bytes(16).hex())
        transfer_id = f"tx-{rng.bytes(16).hex()}"
        if self._kv_role == "kv_producer":
            max_tokens = 1
            params: dict[str, Any] = {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "transfer_id": transfer_id,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_dp_size": 1,
                "remote_tp_size": 1,
            }
        else:
            lo, hi = CONSUMER_OUTPUT_TOKENS
            max_tokens = residual_output_tokens(rng) if initial else int(rng.integers(lo, hi + 1))
            params = {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "transfer_id": transfer_id,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_dp_size": 1,
                "remote_tp_size": 1,
            }
            if self._read:  # what the proxy copies from the prefill's returned params
                num_blocks = -(-prompt_len // BLOCK_SIZE)
                remote = rng.choice(self._remote_blocks, size=num_blocks, replace=False)
                params["remote_engine_id"] = f"127.0.0.1:{self._ports.prefill_handshake}"
                params["remote_block_ids"] = [remote.tolist()]
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sp.update_from_generation_config({}, 2)
        sp.extra_args = {"kv_transfer_params": params}
        return Request(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling_params=sp,
            pooling_params=None,
            mm_features=None,
            block_hasher=self.hasher,
        )


# -- vLLM objects --------------------------------------------------------------------------


_model_dirs: list[tempfile.TemporaryDirectory[str]] = []  # removed at interpreter exit


@cache
def tiny_model_dir() -> str:
    """A tiny local Llama config (the scheduler never runs the model: no weights)."""
    from transformers import LlamaConfig

    holder = tempfile.TemporaryDirectory(prefix="moriio-bench-llama-")
    _model_dirs.append(holder)
    path = Path(holder.name)
    LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_MODEL_LEN,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    init_none_hash(sha256)
    return str(path)


def num_blocks_for(live: int) -> int:
    """Enough blocks that ``live`` requests of the longest shape never preempt."""
    per_request = -(-(PROMPT_TOKENS[1] + CONSUMER_OUTPUT_TOKENS[1]) // BLOCK_SIZE) + 1
    return live * per_request + 256


def make_scheduler(kind: str, role: str, live: int, ports: PeerPorts) -> Scheduler:
    kv_role, read_mode = split_role(role)
    connector, module = CONNECTORS[kind]
    extra = {
        "read_mode": read_mode,
        "host_ip": "127.0.0.1",
        "handshake_port": ports.prefill_handshake
        if kv_role == "kv_producer"
        else ports.decode_handshake,
        "notify_port": ports.prefill_notify if kv_role == "kv_producer" else ports.decode_notify,
    }
    num_blocks = num_blocks_for(live)
    vllm_config = VllmConfig(
        model_config=ModelConfig(
            model=tiny_model_dir(),
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=MAX_MODEL_LEN,
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=1024,
            max_num_batched_tokens=max(live, 1) * PROMPT_TOKENS[1],
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector=connector,
            kv_connector_module_path=module,
            kv_role=kv_role,
            kv_connector_extra_config=extra,
        ),
        device_config=DeviceConfig("cpu"),
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
    )


def model_output(
    scheduler: Scheduler, out: SchedulerOutput, connector_output: KVConnectorOutput
) -> ModelRunnerOutput:
    """One sampled token for every scheduled request whose prompt is complete."""
    req_ids = list(out.num_scheduled_tokens)
    requests = scheduler.requests
    sampled = [
        [7] if requests[rid].num_computed_tokens >= requests[rid].num_tokens else []
        for rid in req_ids
    ]
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
        kv_connector_output=connector_output,
    )


# -- one run -------------------------------------------------------------------------------


@dataclass
class RoleRun:
    """Per measured step: connector ns, schedule+update ns, pickled sizes; plus totals."""

    connector_ns: list[int] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)
    metadata_bytes: list[int] = field(default_factory=list)
    scheduler_output_bytes: list[int] = field(default_factory=list)
    new_requests: list[int] = field(default_factory=list)
    live: list[int] = field(default_factory=list)
    method_ns: dict[str, int] = field(default_factory=dict)
    method_calls: dict[str, int] = field(default_factory=dict)
    preempted: int = 0


class NotifySink:
    """A live ROUTER on loopback that swallows the in-tree WRITE consumer's notifies."""

    def __init__(self) -> None:
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind("tcp://127.0.0.1:0")
        endpoint: bytes = self._socket.getsockopt(zmq.LAST_ENDPOINT)
        self.port = int(endpoint.rsplit(b":", 1)[1])
        self.received = 0

    def drain(self) -> None:
        while self._socket.poll(0):
            self._socket.recv_multipart()
            self.received += 1

    def close(self) -> None:
        self._socket.close(linger=0)


def _ramp_target(live: int, step: int, ramp_steps: int) -> int:
    if step >= ramp_steps:
        return live
    return max(1, -(-live * (step + 1) // ramp_steps))


class _Driver:
    """One Scheduler with one connector, its workload and its fake worker."""

    def __init__(self, kind: str, role: str, live: int, seed: int, sink: NotifySink) -> None:
        ports = PeerPorts(
            prefill_handshake=6301,
            prefill_notify=sink.port,
            decode_handshake=6401,
            decode_notify=61105,
        )
        self.scheduler = make_scheduler(kind, role, live, ports)
        connector = self.scheduler.connector
        if connector is None:
            raise RuntimeError(f"the scheduler built no KV connector for {kind!r}")
        self.timer = ConnectorTimer(connector)
        self.workload = Workload(role, seed, ports)
        self.live = live
        self.ramp = TRANSFER_STEPS + 1 if split_role(role)[0] == "kv_producer" else 1
        self.sink = sink
        self.run = RoleRun()
        self._due_recving: dict[int, set[str]] = defaultdict(set)
        self._due_sending: dict[int, set[str]] = defaultdict(set)

    def step(self, step: int, *, measured: bool) -> None:
        scheduler, timer = self.scheduler, self.timer
        timer.begin_step()
        target = _ramp_target(self.live, step, self.ramp)
        added = 0
        while len(scheduler.requests) < target:
            scheduler.add_request(self.workload.next_request(initial=step == 0))
            added += 1
        live_now = len(scheduler.requests)
        start = time.perf_counter_ns()
        out = scheduler.schedule()
        scheduled_ns = time.perf_counter_ns() - start
        # -- outside the timed region: what a multi-process executor ships, the worker
        metadata_bytes = len(pickle.dumps(out.kv_connector_metadata, protocol=5))
        output_bytes = len(pickle.dumps(out, protocol=5))
        for request_id in timer.events.async_loads:
            self._due_recving[step + TRANSFER_STEPS].add(request_id)
        self.sink.drain()
        connector_output = KVConnectorOutput(
            finished_sending=self._due_sending.pop(step, set()),
            finished_recving=self._due_recving.pop(step, set()),
        )
        runner_output = model_output(scheduler, out, connector_output)
        start = time.perf_counter_ns()
        scheduler.update_from_output(out, runner_output)
        updated_ns = time.perf_counter_ns() - start
        for request_id in timer.events.held:
            self._due_sending[step + TRANSFER_STEPS].add(request_id)
        if not measured:
            timer.method_ns.clear()
            timer.method_calls.clear()
            return
        run = self.run
        run.connector_ns.append(timer.step_ns)
        run.step_ns.append(scheduled_ns + updated_ns)
        run.metadata_bytes.append(metadata_bytes)
        run.scheduler_output_bytes.append(output_bytes)
        run.new_requests.append(added)
        run.live.append(live_now)
        run.preempted += len(out.preempted_req_ids or ())

    def finish(self) -> RoleRun:
        self.run.method_ns = dict(self.timer.method_ns)
        self.run.method_calls = dict(self.timer.method_calls)
        return self.run


def run_role(
    kinds: Sequence[str],
    role: str,
    *,
    live: int,
    steps: int,
    warmup: int,
    seed: int,
    sink: NotifySink,
) -> dict[str, RoleRun | str]:
    """Drive one fresh Scheduler per connector kind in lockstep for ``warmup + steps`` steps.

    Every kind sees the same seeded workload, and step ``i`` of every kind runs back to back,
    so load changes on a shared machine hit all of them alike. Only the last ``steps`` are
    measured. Consumers fill the scheduler in the first step with requests whose output
    lengths stand in for a population already decoding; producers (whose requests live 1 + 4
    steps) ramp up over 5 steps so that every step admits about a fifth of them. Automatic
    garbage collection is off during the run; the young generations are collected after every
    round of steps (all generations every few), outside the timed regions. Returns a
    :class:`RoleRun` per kind, or why that kind failed.
    """
    results: dict[str, RoleRun | str] = {}
    drivers: dict[str, _Driver] = {}
    gc_was_enabled = gc.isenabled()
    try:
        for kind in kinds:
            try:
                drivers[kind] = _Driver(kind, role, live, seed, sink)
            except Exception as exc:
                results[kind] = f"{kind} connector failed: {type(exc).__name__}: {exc}"
        gc.collect()
        gc.freeze()  # as vLLM's engine core does after start-up
        gc.disable()  # collect between steps: a pause is never charged to a timed call
        for step in range(warmup + steps):
            for kind, driver in list(drivers.items()):
                try:
                    driver.step(step, measured=step >= warmup)
                except Exception as exc:
                    results[kind] = f"{kind} connector failed: {type(exc).__name__}: {exc}"
                    del drivers[kind]
                    driver.scheduler.shutdown()
            gc.collect(1 if step % FULL_GC_EVERY else 2)
        for kind, driver in drivers.items():
            results[kind] = driver.finish()
    finally:
        for driver in drivers.values():
            driver.scheduler.shutdown()
        if gc_was_enabled:
            gc.enable()
        gc.unfreeze()
    return {kind: results[kind] for kind in kinds}
