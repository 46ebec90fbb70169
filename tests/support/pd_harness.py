"""A prefill engine and a decode engine made of vLLM's real Scheduler and our connector.

The model forward is simulated: every computed token's KV is a deterministic function of the
layer, the block index and the tokens in that block, written into CPU tensors. So a decode
request whose loaded blocks equal that function received exactly the prefill's KV.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput

from moriio.adapters.clock import SystemClock
from moriio.adapters.inmemory import InMemoryFabric, InMemoryNetwork
from moriio.container import InMemoryAdapters, WorkerIdentity
from moriio.domain.orders import StepOrders
from moriio.domain.settings import ConnectorSettings
from moriio.ports import Clock
from moriio.vllm_plugin import MoriioKVConnector
from moriio.vllm_plugin.metadata import MoriioConnectorMetadata
from support.vllm_scheduler import (
    BLOCK_SIZE,
    make_kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
    model_output,
)

LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
HEADS = 1
HEAD_SIZE = 1


def block_pattern(layer: int, block_index: int, tokens: Iterable[int]) -> torch.Tensor:
    """The KV of one block of one layer (shape [2, bs, H, D]) for the tokens it holds."""
    digest = hashlib.blake2b(
        repr((layer, block_index, tuple(tokens))).encode(), digest_size=8
    ).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    values = rng.standard_normal((2, BLOCK_SIZE, HEADS, HEAD_SIZE), dtype=np.float32)
    return torch.from_numpy(values)


class InMemoryWorld:
    """One fabric and network joining every engine of a test, plus their clock."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.fabric = InMemoryFabric()
        self.network = InMemoryNetwork(self.clock)

    def adapters(
        self, settings: ConnectorSettings, identity: WorkerIdentity, secret: bytes | None
    ) -> InMemoryAdapters:
        return InMemoryAdapters(
            settings=settings,
            identity=identity,
            secret=secret,
            fabric=self.fabric,
            network=self.network,
            clock=self.clock,
        )


@dataclass
class EngineStats:
    steps: int = 0
    verified_blocks: int = 0
    mismatched_blocks: int = 0
    load_errors: set[int] = field(default_factory=set)


class SimEngine:
    """Scheduler (scheduler-role connector inside) + worker-role connector + KV tensors."""

    def __init__(
        self,
        name: str,
        kv_role: str,
        extra: dict[str, Any],
        *,
        num_blocks: int,
        adapters_factory: Callable[..., Any] | None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 1024,
    ) -> None:
        self.name = name
        self.vllm_config = make_vllm_config(
            kv_role,
            extra,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        self.scheduler = make_scheduler(self.vllm_config, num_blocks)
        self.num_blocks = num_blocks
        self.worker = MoriioKVConnector(
            self.vllm_config, KVConnectorRole.WORKER, make_kv_cache_config(num_blocks)
        )
        assert self.worker.worker_side is not None
        self.worker.worker_side.adapters_factory = adapters_factory
        self.kv = {
            name: torch.zeros((2, num_blocks, BLOCK_SIZE, HEADS, HEAD_SIZE), dtype=torch.float32)
            for name in LAYERS
        }
        self.worker.register_kv_caches(self.kv)
        self.stats = EngineStats()
        self.outputs: dict[str, Any] = {}
        self.corrupt_loaded = False  # negative control: overwrite loaded KV with zeros
        self._expect_writes: dict[str, tuple[int, ...]] = {}

    @property
    def connector(self) -> MoriioKVConnector:
        connector = self.scheduler.connector
        assert isinstance(connector, MoriioKVConnector)
        return connector

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def add(
        self, request_id: str, prompt: list[int], max_tokens: int, params: dict[str, Any] | None
    ) -> None:
        self.scheduler.add_request(make_request(request_id, prompt, max_tokens, params))

    def abort(self, request_ids: Iterable[str]) -> None:
        from vllm.v1.request import RequestStatus

        self.scheduler.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)

    def busy(self) -> bool:
        return self.scheduler.has_requests()

    def step(self) -> list[Any]:
        """One engine step; returns the requests that finished in it."""
        sched, worker = self.scheduler, self.worker
        out = sched.schedule()
        meta = out.kv_connector_metadata
        assert isinstance(meta, MoriioConnectorMetadata)
        orders: StepOrders = meta.orders
        worker.bind_connector_metadata(meta)
        if out.has_sync_kv_loads:
            worker.start_load_kv(None)  # type: ignore[arg-type]
        for index, layer in enumerate(LAYERS):
            worker.wait_for_layer_load(layer)
            if index == 0:
                self._check_reads(orders)
            self._forward_layer(index, layer, out)
            worker.save_kv_layer(layer, self.kv[layer], None)
        if not out.has_sync_kv_loads:
            worker.start_load_kv(None)  # type: ignore[arg-type]
        worker.wait_for_save()
        results = worker.get_transfer_results(out.finished_req_ids)
        errors = worker.get_block_ids_with_load_errors()
        self.stats.load_errors |= errors
        self._check_writes(results.finished_recving - results.failed_recving)
        worker.clear_connector_metadata()
        connector_output = KVConnectorOutput(
            finished_sending=results.finished_sending or None,
            finished_recving=results.finished_recving or None,
            failed_recving=results.failed_recving,
            invalid_block_ids=errors,
        )
        engine_outputs = sched.update_from_output(out, model_output(sched, out, connector_output))
        self.stats.steps += 1
        finished = []
        for eco in engine_outputs.values():
            for output in eco.outputs:
                if output.finish_reason is not None:
                    self.outputs[output.request_id] = output
                    finished.append(output)
        return finished

    # -- simulated model -----------------------------------------------------------------

    def _forward_layer(self, layer_index: int, layer: str, out: SchedulerOutput) -> None:
        for rid, num_new in out.num_scheduled_tokens.items():
            request = self.scheduler.requests[rid]
            end = request.num_computed_tokens  # schedule() already advanced it
            start = end - num_new
            self._write_blocks(layer_index, layer, rid, request.all_token_ids, start, end)

    def _write_blocks(
        self, layer_index: int, layer: str, rid: str, tokens: list[int], start: int, end: int
    ) -> None:
        blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)[0]
        for b in range(start // BLOCK_SIZE, -(-end // BLOCK_SIZE)):
            held = tokens[b * BLOCK_SIZE : min(end, (b + 1) * BLOCK_SIZE)]
            self.kv[layer][:, blocks[b]] = block_pattern(layer_index, b, held)

    def _expected_ok(self, rid: str, local_blocks: tuple[int, ...], upto: int) -> None:
        request = self.scheduler.requests.get(rid)
        if request is None:
            return
        blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)[0]
        tokens = request.prompt_token_ids
        first = blocks.index(local_blocks[0]) if local_blocks else 0
        for j, block in enumerate(local_blocks):
            b = first + j
            held = tokens[b * BLOCK_SIZE : min(upto, (b + 1) * BLOCK_SIZE)]
            for layer_index, layer in enumerate(LAYERS):
                if block in self.stats.load_errors:
                    continue
                same = torch.equal(self.kv[layer][:, block], block_pattern(layer_index, b, held))
                if same:
                    self.stats.verified_blocks += 1
                else:
                    self.stats.mismatched_blocks += 1
                if self.corrupt_loaded:
                    self.kv[layer][:, block] = 0

    def _check_reads(self, orders: StepOrders) -> None:
        pending_errors = set(self.worker._load_errors)
        for order in orders.reads:
            if pending_errors.intersection(order.local_block_ids):
                continue
            request = self.scheduler.requests.get(order.request_id)
            if request is not None:
                self._expected_ok(
                    order.request_id, order.local_block_ids, len(request.prompt_token_ids)
                )
        for order in orders.expect_writes:
            self._expect_writes[order.request_id] = order.local_block_ids

    def _check_writes(self, finished_ok: set[str]) -> None:
        for rid in finished_ok:
            blocks = self._expect_writes.pop(rid, None)
            request = self.scheduler.requests.get(rid)
            if blocks is not None and request is not None:
                self._expected_ok(rid, blocks, len(request.prompt_token_ids))


_ids = itertools.count()


def new_transfer_id() -> str:
    return f"tx-{next(_ids):08d}"


@dataclass(frozen=True)
class Ports:
    handshake: int
    notify: int


def engine_extra(read_mode: bool, ports: Ports, **more: Any) -> dict[str, Any]:
    return {
        "read_mode": read_mode,
        "transport": "nixl",
        "host_ip": "127.0.0.1",
        "handshake_port": ports.handshake,
        "notify_port": ports.notify,
        **more,
    }


class PDProxy:
    """Routes requests like vLLM's MoRIIO toy proxy: prefill with max_tokens=1, then decode."""

    def __init__(
        self,
        prefill: SimEngine,
        decode: SimEngine,
        read_mode: bool,
        prefill_ports: Ports,
        decode_ports: Ports,
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        self.read_mode = read_mode
        self.prefill_ports = prefill_ports
        self.decode_ports = decode_ports
        self.pending: dict[str, tuple[list[int], int]] = {}  # P request id -> (prompt, max_tokens)
        self.done: dict[str, Any] = {}

    def submit(self, key: str, prompt: list[int], max_tokens: int) -> None:
        tid = new_transfer_id()
        p_params: dict[str, Any] = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "transfer_id": tid,
        }
        if not self.read_mode:
            p_params.update(
                remote_host="127.0.0.1",
                remote_handshake_port=self.decode_ports.handshake,
                remote_notify_port=self.decode_ports.notify,
                remote_tp_size=1,
            )
            d_params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "transfer_id": tid,
                "remote_host": "127.0.0.1",
                "remote_handshake_port": self.prefill_ports.handshake,
                "remote_notify_port": self.prefill_ports.notify,
                "remote_tp_size": 1,
            }
            self.decode.add(f"d-{key}", prompt, max_tokens, d_params)
        self.prefill.add(f"p-{key}", prompt, 1, p_params)
        self.pending[f"p-{key}"] = (prompt, max_tokens)

    def step(self) -> None:
        for output in self.prefill.step():
            prompt, max_tokens = self.pending.pop(output.request_id)
            key = output.request_id[2:]
            if self.read_mode and output.kv_transfer_params:
                self.decode.add(f"d-{key}", prompt, max_tokens, dict(output.kv_transfer_params))
        for output in self.decode.step():
            self.done[output.request_id] = output

    def busy(self) -> bool:
        return bool(self.pending) or self.prefill.busy() or self.decode.busy()

    def run(self, max_steps: int = 10_000) -> int:
        steps = 0
        while self.busy():
            self.step()
            steps += 1
            if steps >= max_steps:
                raise AssertionError(f"not done after {steps} steps: {self.describe()}")
        return steps

    def describe(self) -> str:
        return (
            f"pending={len(self.pending)} prefill_reqs={len(self.prefill.scheduler.requests)} "
            f"decode_reqs={len(self.decode.scheduler.requests)}"
        )
