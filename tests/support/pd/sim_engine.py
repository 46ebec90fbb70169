"""One simulated engine: vLLM's real Scheduler, our connector in both roles, CPU KV tensors.

The model forward is simulated: every computed token's KV is a deterministic function of the
layer, the block index and the tokens in that block, written into CPU tensors. So a decode
request whose loaded blocks equal that function received exactly the prefill's KV.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from vllm.config.kv_transfer import KVRole
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus

from moriio.bootstrap import WorkerIdentity
from moriio.config.settings import ConnectorSettings
from moriio.domain.params.orders import StepOrders
from moriio.domain.worker.service import WorkerService
from moriio.testing.inmemory import InMemoryControlChannel, InMemoryTransferEngine
from moriio.vllm_plugin import MoriioKVConnector
from moriio.vllm_plugin.metadata import MoriioConnectorMetadata
from moriio_tools.vllm_harness import (
    BLOCK_SIZE,
    build_scheduler,
    make_kv_cache_config,
    make_request,
    model_output,
)
from support.pd.worlds import AdaptersFactory
from support.vllm_scheduler import make_vllm_config

LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
HEADS = 1
HEAD_SIZE = 1


def block_pattern(
    layer: int, block_index: int, tokens: Iterable[int], salt: int = 0
) -> torch.Tensor:
    """The KV of one block of one layer (shape [2, bs, H, D]) for the tokens it holds."""
    key = repr((layer, block_index, tuple(tokens), salt)).encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    values = rng.standard_normal((2, BLOCK_SIZE, HEADS, HEAD_SIZE), dtype=np.float32)
    return torch.from_numpy(values)


@dataclass
class EngineStats:
    steps: int = 0
    verified_blocks: int = 0
    mismatched_blocks: int = 0
    prefix_cache_hits: int = 0  # tokens served from this engine's own prefix cache
    preemptions: int = 0
    load_errors: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _BlockCheck:
    block: int
    layer_index: int
    equal: bool


class SimEngine:
    """Scheduler (scheduler-role connector inside) + worker-role connector + KV tensors."""

    def __init__(
        self,
        name: str,
        kv_role: KVRole,
        extra: dict[str, Any],
        *,
        num_blocks: int,
        adapters_factory: AdaptersFactory | None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 1024,
        kv_load_failure_policy: str = "fail",
    ) -> None:
        self.name = name
        self.vllm_config = make_vllm_config(
            kv_role,
            extra,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        kv_config = self.vllm_config.kv_transfer_config
        assert kv_config is not None
        kv_config.kv_load_failure_policy = kv_load_failure_policy  # type: ignore[assignment]
        self.scheduler = build_scheduler(self.vllm_config, num_blocks)
        self.num_blocks = num_blocks
        self.worker = MoriioKVConnector(
            self.vllm_config, KVConnectorRole.WORKER, make_kv_cache_config(num_blocks)
        )
        worker_side = self.worker.worker_side
        assert worker_side is not None
        self.adapters: Any = None
        if adapters_factory is not None:
            factory = adapters_factory

            def capture(
                settings: ConnectorSettings, identity: WorkerIdentity, secret: bytes | None
            ) -> Any:
                self.adapters = factory(settings, identity, secret)
                return self.adapters

            worker_side.adapters_factory = capture
        self.kv = {
            name: torch.zeros((2, num_blocks, BLOCK_SIZE, HEADS, HEAD_SIZE), dtype=torch.float32)
            for name in LAYERS
        }
        self.worker.register_kv_caches(self.kv)
        self.tell_scheduler_handshake_metadata()
        self.stats = EngineStats()
        self.outputs: dict[str, Any] = {}
        self.finished_sending: Counter[str] = Counter()
        self.finished_recving: Counter[str] = Counter()
        self.kv_logging = KVConnectorLogging(kv_config)
        self.write_salt = 0  # negative control: a non-zero salt makes this engine's KV wrong
        self.corrupt_loaded = False  # negative control: overwrite loaded KV with zeros
        self.metadata_sizes: list[int] = []  # pickled size of each step's connector metadata
        self.model_runner_v2 = False  # step in Model Runner V2's order with a speculator
        self._expect_writes: dict[str, tuple[int, ...]] = {}
        self._checks: list[_BlockCheck] = []

    # -- accessors -----------------------------------------------------------------------

    @property
    def connector(self) -> MoriioKVConnector:
        connector = self.scheduler.connector
        assert isinstance(connector, MoriioKVConnector)
        return connector

    @property
    def service(self) -> WorkerService:
        worker_side = self.worker.worker_side
        assert worker_side is not None
        service = worker_side.service
        assert service is not None
        return service

    @property
    def transfer_engine(self) -> InMemoryTransferEngine:
        """The in-memory engine (fault knobs); only in an :class:`InMemoryWorld`."""
        engine = self.adapters.engine()
        assert isinstance(engine, InMemoryTransferEngine)
        return engine

    @property
    def channel(self) -> InMemoryControlChannel[Any]:
        """The in-memory notify channel; only in an :class:`InMemoryWorld`."""
        channel = self.adapters.notify_channel()
        assert isinstance(channel, InMemoryControlChannel)
        return channel

    def free_blocks(self) -> int:
        return int(self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def transfer_stats(self) -> dict[str, int | float]:
        """Stats as vLLM's KV-transfer logger accumulated them (workers + scheduler side)."""
        accumulated = self.kv_logging.transfer_stats_accumulator
        return {} if accumulated is None else accumulated.reduce()

    def leftovers(self) -> list[str]:
        """Everything still held or tracked; empty when the engine is quiescent."""
        problems = []
        if self.free_blocks() != self.num_blocks - 1:
            problems.append(f"{self.name}: {self.free_blocks()}/{self.num_blocks - 1} free")
        if self.scheduler.requests:
            problems.append(f"{self.name}: requests {sorted(self.scheduler.requests)[:5]}")
        if self.service.num_live:
            problems.append(f"{self.name}: {self.service.num_live} live worker transfers")
        if self.service.ctx.poster.num_inflight:
            problems.append(f"{self.name}: {self.service.ctx.poster.num_inflight} batches")
        side = self.connector.scheduler_side
        assert side is not None
        if side.producer is not None and (side.producer.num_tracked or side.producer.num_held):
            problems.append(
                f"{self.name}: producer book tracks {side.producer.num_tracked}, "
                f"holds {side.producer.num_held}"
            )
        consumer = side.consumer
        if consumer is not None and (consumer.num_awaiting_write or consumer.num_awaiting_read):
            problems.append(
                f"{self.name}: consumer book awaits {consumer.num_awaiting_write} writes, "
                f"{consumer.num_awaiting_read} reads"
            )
        repeated = [r for r, n in (self.finished_sending + self.finished_recving).items() if n > 1]
        if repeated:
            problems.append(f"{self.name}: reported finished twice: {repeated[:5]}")
        return problems

    def tell_scheduler_handshake_metadata(self) -> None:
        """What vLLM's engine core does at start (and 0.33's after a wake): hand the workers'
        handshake metadata to the scheduler's connector."""
        metadata = self.worker.get_handshake_metadata()
        if metadata is not None:
            self.connector.set_xfer_handshake_metadata_pp_aware({(0, 0): metadata})

    # -- requests ------------------------------------------------------------------------

    def add(
        self, request_id: str, prompt: list[int], max_tokens: int, params: dict[str, Any] | None
    ) -> None:
        self.scheduler.add_request(make_request(request_id, prompt, max_tokens, params))

    def abort(self, request_ids: Iterable[str]) -> None:
        self.scheduler.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)

    def busy(self) -> bool:
        return bool(self.scheduler.has_requests())

    def close(self) -> None:
        self.worker.shutdown()

    # -- one engine step -----------------------------------------------------------------

    def step(self) -> list[Any]:
        """One engine step; returns the requests that finished in it."""
        sched, worker = self.scheduler, self.worker
        out = sched.schedule()
        meta = out.kv_connector_metadata
        assert isinstance(meta, MoriioConnectorMetadata)
        orders: StepOrders = meta.orders
        self.metadata_sizes.append(len(pickle.dumps(meta)))  # what multi-process executors ship
        worker.bind_connector_metadata(meta)
        if out.has_sync_kv_loads:
            worker.start_load_kv(None)  # type: ignore[arg-type]
        for order in orders.expect_writes:
            self._expect_writes[order.request_id] = order.local_block_ids
        for read in orders.reads:
            if read.load_async:  # checked when reported finished, as pushed KV is
                self._expect_writes[read.request_id] = read.local_block_ids
        # Model Runner V2 with a speculator (vLLM 0.33): the last layer is the drafter's, run
        # after the transfer results; its save is awaited in ``finalize_step``.
        drafter = LAYERS[-1] if self.model_runner_v2 else None
        for index, layer in enumerate(LAYERS):
            if layer != drafter:
                self._run_layer(orders, index, out)
        if not out.has_sync_kv_loads:
            worker.start_load_kv(None)  # type: ignore[arg-type]
        if drafter is None:
            worker.wait_for_save()
        results = worker.get_transfer_results(out.finished_req_ids)
        errors = worker.get_block_ids_with_load_errors()
        if drafter is not None:
            self._run_layer(orders, LAYERS.index(drafter), out)
            worker.wait_for_save()  # ActiveKVConnector.finalize_step
        self.stats.load_errors |= errors
        self.finished_sending.update(results.finished_sending)
        self.finished_recving.update(results.finished_recving)
        self._check_writes(results.finished_recving - results.failed_recving)
        self._settle_checks(errors)
        worker_stats = worker.get_kv_connector_stats()
        worker.clear_connector_metadata()
        connector_output = KVConnectorOutput(
            finished_sending=results.finished_sending or None,
            finished_recving=results.finished_recving or None,
            failed_recving=results.failed_recving,
            invalid_block_ids=errors,
            kv_connector_stats=worker_stats,
        )
        engine_outputs = sched.update_from_output(out, model_output(sched, out, connector_output))
        self.stats.steps += 1
        finished = []
        for eco in engine_outputs.values():
            stats = eco.scheduler_stats
            if stats is not None and stats.kv_connector_stats:
                self.kv_logging.observe(stats.kv_connector_stats)
            if stats is not None and stats.prefix_cache_stats is not None:
                self.stats.prefix_cache_hits += stats.prefix_cache_stats.hits
            for output in eco.outputs:
                for event in output.events or ():
                    self.stats.preemptions += event.type == EngineCoreEventType.PREEMPTED
                if output.finish_reason is not None:
                    self.outputs[output.request_id] = output
                    finished.append(output)
        return finished

    # -- simulated model -----------------------------------------------------------------

    def _run_layer(self, orders: StepOrders, index: int, out: SchedulerOutput) -> None:
        """One attention layer: wait for its load, check it, compute it, save it."""
        layer = LAYERS[index]
        self.worker.wait_for_layer_load(layer)
        self._check_reads(orders, index)
        self._forward_layer(index, layer, out)
        self.worker.save_kv_layer(layer, self.kv[layer], None)

    def _forward_layer(self, layer_index: int, layer: str, out: SchedulerOutput) -> None:
        for rid, num_new in out.num_scheduled_tokens.items():
            request = self.scheduler.requests[rid]
            end = request.num_computed_tokens  # schedule() already advanced it
            start = end - num_new
            blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)[0]
            tokens = request.all_token_ids
            for b in range(start // BLOCK_SIZE, -(-end // BLOCK_SIZE)):
                held = tokens[b * BLOCK_SIZE : min(end, (b + 1) * BLOCK_SIZE)]
                self.kv[layer][:, blocks[b]] = block_pattern(layer_index, b, held, self.write_salt)

    def _compare(
        self, rid: str, local_blocks: tuple[int, ...], layer_indexes: Iterable[int]
    ) -> None:
        """Compare loaded blocks with the prefill's KV; settled once load errors are known."""
        request = self.scheduler.requests.get(rid)
        if request is None or not local_blocks:
            return
        blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)[0]
        tokens = request.prompt_token_ids
        assert tokens is not None
        upto = len(tokens)
        first = blocks.index(local_blocks[0])
        for layer_index in layer_indexes:
            layer = LAYERS[layer_index]
            for j, block in enumerate(local_blocks):
                b = first + j
                held = tokens[b * BLOCK_SIZE : min(upto, (b + 1) * BLOCK_SIZE)]
                equal = torch.equal(self.kv[layer][:, block], block_pattern(layer_index, b, held))
                self._checks.append(_BlockCheck(block, layer_index, equal))
                if self.corrupt_loaded:
                    self.kv[layer][:, block] = 0

    def _check_reads(self, orders: StepOrders, layer_index: int) -> None:
        """READ: the layer's reads ended (``wait_for_layer_load``); check before the forward."""
        for order in orders.reads:
            if not order.load_async:
                self._compare(order.request_id, order.local_block_ids, (layer_index,))

    def _check_writes(self, finished_ok: set[str]) -> None:
        for rid in finished_ok:
            blocks = self._expect_writes.pop(rid, None)
            if blocks is not None:
                self._compare(rid, blocks, range(len(LAYERS)))

    def _settle_checks(self, errors: set[int]) -> None:
        for check in self._checks:
            if check.block in errors:
                continue  # reported as a load error: vLLM never uses it
            if check.equal:
                self.stats.verified_blocks += 1
            else:
                self.stats.mismatched_blocks += 1
        self._checks.clear()
