"""The layer barrier of ``scripts/gpu_check.py``: moriio's gates inside a captured CUDA graph.

A graph of L "layers" is captured once, each layer a wait on its gate (moriio's
``StreamGates``, the connector's code) then a kernel reading the layer's KV. The host arms
the gates (moriio's ``GateBook``), replays the graph, then lands each layer with a NIXL READ
from the other process and opens its gate when the read ended. Checks:

* barrier: every layer the graph read holds the landed bytes;
* control: the same graph captured without the waits reads layers before they land;
* stale: two armed replays queued back to back; the second never passes on the first's
  openings (it reads the second landing's bytes);
* failed read: a READ that fails still opens its gate, the replay finishes, that layer alone
  differs;
* cost: replay time per layer with the gates open, against the graph without waits, and the
  same waits on a device-memory word; the host's cost of arming.

``--dry-run`` runs the same gates, book, NIXL READs and comparisons over host memory with a
fake stream (no graph: the "replay" queues the same waits and reads on it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from moriio.domain.worker.consumer.gate_book import GateBook
from moriio.ports import TransferOp
from moriio.testing.fake_stream import BASE_ADDRESS, FakeStream
from moriio.adapters.device.stream_gates import StreamGates, mem_ops, probe_stream_gates

FINISH_TIMEOUT = 20.0  # seconds a replay may take once every gate opened


def host_pattern(seed: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


class Forward:
    """One captured forward (or, on the dry run, the same ops queued on the fake stream)."""

    def __init__(self, bench: Barrier, out: torch.Tensor, waits: bool) -> None:
        self.bench, self.out, self.waits = bench, out, waits
        self.graph: Any = None
        if bench.fake is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=bench.side):
                self._layers()

    def _layers(self) -> None:
        bench = self.bench
        for layer in range(bench.layers):
            if self.waits:
                bench.gates.enqueue_wait(layer)
            if bench.fake is None:
                self.out[layer].copy_(bench.layer_view(layer))
            else:
                bench.fake.kernel(self._reader(layer))

    def _reader(self, layer: int) -> Callable[[], None]:
        return lambda: self.out[layer].copy_(self.bench.layer_view(layer))

    def launch(self) -> Any:
        """Queue one replay; returns what :meth:`Barrier.finished` waits on."""
        bench = self.bench
        if bench.fake is not None:
            self._layers()
            ended = [False]
            bench.fake.kernel(lambda: ended.__setitem__(0, True))
            bench.fake.run()
            return ended
        with torch.cuda.stream(bench.side):
            self.graph.replay()
            done = torch.cuda.Event()
            done.record()
        return done


class Barrier:
    def __init__(self, run: Any, layers: int, layer_bytes: int, dry_run: bool) -> None:
        self.run, self.layers, self.layer_bytes = run, layers, layer_bytes
        self.names = [f"model.layers.{i}.attn" for i in range(layers)]
        self.fake: FakeStream | None = None
        if dry_run:
            self.fake = FakeStream(layers)
            self.gates = StreamGates(self.fake, self.fake.words, BASE_ADDRESS, lambda: 0)
            self.side: Any = None
        else:
            gates = probe_stream_gates(run.device, layers)
            if isinstance(gates, str):
                raise RuntimeError(f"no layer gates on this device: {gates}")
            self.gates = gates
            self.side = torch.cuda.Stream(run.device)
        self.book = GateBook(self.gates, self.names)
        self._armed = 0
        self._landed: set[tuple[str, int]] = set()  # (transfer, layer) whose read ended

    def layer_view(self, layer: int) -> torch.Tensor:
        start = layer * self.layer_bytes
        return self.run.kv[start : start + self.layer_bytes]

    def out(self) -> torch.Tensor:
        return torch.zeros(self.layers, self.layer_bytes, dtype=torch.uint8, device=self.run.device)

    def arm(self) -> str:
        """Close the gates before the next replay; returns the transfer it waits for."""
        self._armed += 1
        transfer = f"t{self._armed}"
        if self.side is None:
            self.book.arm(frozenset({transfer}))
        else:
            with torch.cuda.stream(self.side):
                self.book.arm(frozenset({transfer}))
        return transfer

    def _waiting_on(self, name: str, transfers: frozenset[str]) -> bool:
        layer = self.names.index(name)
        return any((transfer, layer) not in self._landed for transfer in transfers)

    def land(self, transfer: str, delay: float, fail_layer: int | None = None) -> int:
        """READ each layer of ``transfer`` from the peer, ``delay`` apart, opening its gate
        once the read ended; returns how many reads failed."""
        failed = 0
        for layer in range(self.layers):
            time.sleep(delay)
            local = np.array([layer * self.layer_bytes], dtype=np.int64)
            remote = np.array([self.run.nbytes if layer == fail_layer else local[0]])
            try:
                self.run.transfer(TransferOp.READ, local, remote, self.layer_bytes)
            except Exception:  # noqa: BLE001 - a failed read is what this case checks
                failed += 1
            self._landed.add((transfer, layer))
            self.book.open_ready(self._waiting_on)
            if self.fake is not None:
                self.fake.run()
        return failed

    def finished(self, done: Any, timeout: float = FINISH_TIMEOUT) -> bool:
        if self.fake is not None:
            self.fake.run()
            return bool(done[0])
        deadline = time.perf_counter() + timeout
        while not done.query():
            if time.perf_counter() > deadline:
                self.gates.open_all()  # never leave the device waiting
                return False
            time.sleep(0.0005)
        return True

    def layers_equal(self, out: torch.Tensor, seed: int) -> list[bool]:
        if self.fake is None:
            torch.cuda.synchronize(self.run.device)
        expected = host_pattern(seed, self.layers * self.layer_bytes)
        got = out.cpu().numpy().reshape(self.layers, -1)
        wanted = expected.reshape(self.layers, -1)
        return [bool(np.array_equal(got[i], wanted[i])) for i in range(self.layers)]

    def fill_peer(self, seed: int) -> None:
        self.run.ask("fill", (seed, self.layers * self.layer_bytes))
        self.run.kv.zero_()
        if self.fake is None:
            torch.cuda.synchronize(self.run.device)


def barrier_checks(run: Any, layers: int, delay: float, dry_run: bool, row: Any) -> list[Any]:
    layer_bytes = min(1 << 20, (run.nbytes // layers) & ~4095)
    bench = Barrier(run, layers, layer_bytes, dry_run)
    rows = []
    waits_a, waits_b = Forward(bench, bench.out(), True), Forward(bench, bench.out(), True)
    control = Forward(bench, bench.out(), False)

    bench.fill_peer(201)
    transfer = bench.arm()
    done = waits_a.launch()
    bench.land(transfer, delay)
    ok = bench.finished(done)
    equal = sum(bench.layers_equal(waits_a.out, 201)) if ok else 0
    rows.append(row("layer barrier", f"{equal}/{layers} layers read landed KV", equal == layers))

    bench.fill_peer(202)
    done = control.launch()
    bench.land("unarmed", delay)
    bench.finished(done)
    raced = layers - sum(bench.layers_equal(control.out, 202))
    detail = f"{layers - raced}/{layers} layers equal without waits (the race, shown)"
    rows.append(row("barrier control", detail, raced > 0))

    rows.append(_stale_check(bench, waits_a, waits_b, delay, row))
    rows.append(_failed_read_check(bench, waits_a, delay, row))
    if not dry_run:
        rows.append(_cost(bench, waits_a, control, row))
    return rows


def _stale_check(bench: Barrier, first: Forward, second: Forward, delay: float, row: Any) -> Any:
    bench.fill_peer(203)
    transfer_first = bench.arm()
    done_first = first.launch()
    transfer_second = bench.arm()  # queued while the first replay still waits on its gates
    done_second = second.launch()
    bench.land(transfer_first, delay)
    ok = bench.finished(done_first)
    bench.run.ask("fill", (204, bench.layers * bench.layer_bytes))
    bench.land(transfer_second, delay)
    ok = bench.finished(done_second) and ok
    first_equal = sum(bench.layers_equal(first.out, 203))
    second_equal = sum(bench.layers_equal(second.out, 204)) if ok else 0
    detail = f"first {first_equal}/{bench.layers}, second {second_equal}/{bench.layers}"
    return row("barrier stale", detail, ok and first_equal == second_equal == bench.layers)


def _failed_read_check(bench: Barrier, forward: Forward, delay: float, row: Any) -> Any:
    bench.fill_peer(205)
    transfer = bench.arm()
    started = time.perf_counter()
    done = forward.launch()
    failed = bench.land(transfer, delay, fail_layer=bench.layers // 2)
    ok = bench.finished(done)
    seconds = time.perf_counter() - started
    equal = bench.layers_equal(forward.out, 205)
    wrong = [i for i, same in enumerate(equal) if not same]
    detail = f"{failed} read failed, replay ended in {seconds:.2f} s, layers differing {wrong}"
    return row("barrier failure", detail, ok and failed == 1 and wrong == [bench.layers // 2])


def _replay_us(graphs: Sequence[Any], repeats: int = 200) -> list[float]:
    times = []
    for graph in graphs:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(repeats):
            graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) / repeats * 1e6)
    return times


def _cost(bench: Barrier, waits: Forward, plain: Forward, row: Any) -> Any:
    """Per-layer cost of a wait on an open gate (host-memory flag), against the graph without
    waits and a graph waiting on a device-memory word; the host's cost of one arming."""
    device_word = torch.ones(bench.layers, dtype=torch.int32, device=bench.run.device)
    ops = mem_ops()  # libcuda, or libamdhip64 on ROCm
    graph = torch.cuda.CUDAGraph()
    out = bench.out()
    with torch.cuda.graph(graph, stream=bench.side):
        stream = int(torch.cuda.current_stream().cuda_stream)
        for layer in range(bench.layers):
            ops.wait_any_bit(stream, device_word[layer].data_ptr(), 1)
            out[layer].copy_(bench.layer_view(layer))
    runs = [_replay_us([waits.graph, plain.graph, graph]) for _ in range(3)]
    with_waits, without, device_flags = (min(times) for times in zip(*runs, strict=True))
    per_layer = (with_waits - without) / bench.layers
    per_layer_device = (device_flags - without) / bench.layers
    with torch.cuda.stream(bench.side):
        started = time.perf_counter()
        for _ in range(100):
            bench.gates.close_all()
        arm_us = (time.perf_counter() - started) / 100 * 1e6
    torch.cuda.synchronize()
    bench.gates.open_all()
    detail = (
        f"{per_layer:.2f} us/layer host flag, {per_layer_device:.2f} us/layer device word "
        f"(replay {with_waits:.1f} / {without:.1f} / {device_flags:.1f} us); arming "
        f"{bench.layers} gates {arm_us:.0f} us"
    )
    return row("barrier cost", detail, per_layer <= 5.0)
