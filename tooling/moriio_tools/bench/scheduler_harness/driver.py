"""One run of one role: a Scheduler per connector stepped in lockstep, timed per step."""

from __future__ import annotations

import gc
import pickle
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import zmq
from vllm.v1.outputs import KVConnectorOutput

from moriio_tools.bench.scheduler_harness.connectors import (
    FULL_GC_EVERY,
    TRANSFER_STEPS,
    ConnectorTimer,
    split_role,
)
from moriio_tools.bench.scheduler_harness.workload import (
    PeerPorts,
    Workload,
    make_scheduler,
    model_output,
)


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
