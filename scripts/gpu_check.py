"""GPU check of the NIXL path: VRAM->VRAM transfers between two processes, and fenced pushes.

Run it through ``scripts/gpu_check.sh`` (which installs missing wheels first). Needs torch,
numpy, structlog and NIXL; no vLLM. ``--dry-run`` runs the same code on host memory with
torch on the CPU, to check the plumbing anywhere.

Checks, all in one run, one table at the end (exit status 1 on any mismatch):

1. NIXL READ and WRITE between two processes' device tensors, blocks in contiguous and in
   random order, bytes verified, bandwidth next to torch's device-to-device copy of the same
   blocks measured in the same run.
2. WRITE ordering: a kernel writes a layer, a fence is recorded on its stream, the push is
   posted only once the fence completed (no host synchronisation): the receiver's bytes must
   equal the sender's.
3. The same over two streams: each layer waits for the fence of the stream that wrote it.
   Then same-host device copies as users get them (``scripts/gpu_same_host.py``):
   back-to-back batches timed with device events, host time per post and kernel time apart,
   random blocks and a 61-layer request as one batch each, next to the device's contiguous
   copy of the same bytes; a second GPU is the peer where there is one.
4. The layer barrier inside a captured CUDA graph (``scripts/gpu_barrier.py``): every layer
   reads landed KV with moriio's gates, the race shows without them, a later replay never
   passes on an earlier one's openings, a failed read still opens its gate; the per-layer
   cost.
5. On a GPU, the protocol UCX chose for each direction of device memory (its
   ``UCX_PROTO_INFO`` table, captured): a READ by ``software emulation`` fails the check,
   and so does a direction whose table was not seen.

On ROCm torch's ``cuda`` device is the HIP device: the same code runs there.

UCX runs with the settings a user gets (moriio's defaults; nothing else is set here).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import tempfile
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gpu_barrier import barrier_checks
from gpu_same_host import Peer, in_process_peer
from gpu_same_host import same_host_rows as same_host_timing

from moriio.adapters.nixl import NixlTransferEngine
from moriio.adapters.nixl.protocols import (
    DIRECTIONS,
    DirectionProtocols,
    parse_protocol_tables,
    protocol_advice,
)
from moriio.domain.worker.producer.write_fences import FencedLayer, FencedSaves
from moriio.ports import DeviceFence, MemoryKind, TransferOp, TransferState
from moriio.adapters.device.streams import TorchFences, device_binder
from moriio.adapters.device.same_host import same_host_wrapper

TIMEOUT = 60.0  # seconds for one transfer or one fence
CHECK_WIDTH = 34  # the check column of the table


@dataclass
class Row:
    check: str
    detail: str
    ok: bool
    nixl_gbps: float | None = None
    torch_gbps: float | None = None


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().numpy().tobytes()).hexdigest()


def pattern(seed: int, nbytes: int, device: torch.device) -> torch.Tensor:
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    return torch.from_numpy(data).to(device)


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.cuda.synchronize(device)


def kind_of(device: torch.device) -> tuple[MemoryKind, int]:
    if device.type == "cpu":
        return MemoryKind.HOST, 0
    return MemoryKind.DEVICE, device.index or 0


# -- the target process ------------------------------------------------------------------


def make_engine(device: torch.device, loopback: bool, same_host: bool) -> Any:
    """NIXL, or NIXL wrapped in moriio's same-host device copies (the connector's wrapper)."""
    engine = NixlTransferEngine(loopback=loopback)
    return same_host_wrapper(device)(engine) if same_host else engine


def target(conn: Any, device_name: str, nbytes: int, loopback: bool, same_host: bool) -> None:
    """Registers a KV tensor, then serves commands: fill, digest, stop."""
    device = torch.device(device_name)
    bind = device_binder(device)
    if bind is not None:
        bind()
    kv = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    engine = make_engine(device, loopback, same_host)
    kind, index = kind_of(device)
    region = engine.register_region(kv.data_ptr(), nbytes, kind, index)
    conn.send((engine.metadata(), region.descriptor))
    while True:
        engine.progress()
        if not conn.poll(0.0005):
            continue
        command, arg = conn.recv()
        if command == "fill":
            seed, span = arg
            kv[:span].copy_(pattern(seed, span, device))
            synchronize(device)
            conn.send("filled")
        elif command == "zero":
            kv.zero_()
            synchronize(device)
            conn.send("zeroed")
        elif command == "digest":
            start, stop = arg
            conn.send(digest(kv[start:stop]))
        else:
            break
    engine.deregister_region(region)
    engine.close()
    flush_c_stdio()  # UCX's tables, before the process ends without flushing


# -- the initiator -----------------------------------------------------------------------


class Initiator:
    def __init__(
        self,
        device: torch.device,
        peer_device: str,
        nbytes: int,
        loopback: bool,
        same_host: bool = False,
    ):
        self.device, self.nbytes = device, nbytes
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        args = (child, peer_device, nbytes, loopback, same_host)
        self.proc = ctx.Process(target=target, args=args)
        self.proc.start()
        if not self.conn.poll(TIMEOUT):
            raise RuntimeError("the target process did not register its tensor in time")
        metadata, descriptor = self.conn.recv()
        self.kv = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.engine = make_engine(device, loopback, same_host)
        self._sizes: dict[tuple[int, int], np.ndarray] = {}
        kind, index = kind_of(device)
        self.region = self.engine.register_region(self.kv.data_ptr(), nbytes, kind, index)
        self.remote = self.engine.import_region(self.engine.add_peer(metadata), descriptor)

    def ask(self, command: str, arg: Any = None) -> Any:
        self.conn.send((command, arg))
        return self.conn.recv()

    def transfer(self, op: TransferOp, local: np.ndarray, remote: np.ndarray, size: int) -> float:
        """One batch of ``size``-byte blocks; seconds from post to completion."""
        sizes = self._sizes.get((len(local), size))
        if sizes is None:  # one read-only array per shape, as a plan reused per layer
            sizes = self._sizes[(len(local), size)] = np.full(len(local), size, dtype=np.int64)
            sizes.flags.writeable = False
        started = time.perf_counter()
        handle = self.engine.post(op, self.region, self.remote, local, remote, sizes, "check")
        deadline = started + TIMEOUT
        while True:
            status = self.engine.poll(handle)
            if status.state is TransferState.SUCCEEDED:
                break
            if status.state is not TransferState.IN_PROGRESS or time.perf_counter() > deadline:
                raise RuntimeError(f"{op.value} ended {status.state.value}: {status.message}")
        elapsed = time.perf_counter() - started
        self.engine.release(handle)
        return elapsed

    def close(self) -> None:
        self.conn.send(("stop", None))
        self.proc.join(TIMEOUT)
        self.engine.deregister_region(self.region)
        self.engine.close()


def blocks(order: str, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if order == "contiguous":
        ids = np.arange(count, dtype=np.int64)
        return ids, ids.copy()
    rng = np.random.default_rng(seed)
    return rng.permutation(count).astype(np.int64), rng.permutation(count).astype(np.int64)


def torch_copy_seconds(
    device: torch.device, src: torch.Tensor, lids: np.ndarray, rids: np.ndarray
) -> float:
    dst = torch.empty_like(src)
    index_src = torch.from_numpy(lids).to(device)
    index_dst = torch.from_numpy(rids).to(device)
    dst.index_copy_(0, index_dst, src.index_select(0, index_src))  # warm-up
    synchronize(device)
    started = time.perf_counter()
    dst.index_copy_(0, index_dst, src.index_select(0, index_src))
    synchronize(device)
    return time.perf_counter() - started


def bulk_checks(run: Initiator, block_bytes: int, count: int, rounds: int) -> list[Row]:
    rows = []
    span = block_bytes * count
    for op in (TransferOp.READ, TransferOp.WRITE):
        for order in ("contiguous", "random"):
            lids, rids = blocks(order, count, seed=11)
            local_off, remote_off = lids * block_bytes, rids * block_bytes
            for array in (local_off, remote_off):  # read-only, as the planner's plans are
                array.flags.writeable = False
            seconds = []
            for attempt in range(rounds + 1):
                seed = 100 + attempt
                if op is TransferOp.READ:
                    run.ask("fill", (seed, span))
                    run.kv.zero_()
                else:
                    run.kv[:span].copy_(pattern(seed, span, run.device))
                    run.ask("zero")
                synchronize(run.device)
                elapsed = run.transfer(op, local_off, remote_off, block_bytes)
                if attempt:
                    seconds.append(elapsed)
            src = pattern(100 + rounds, span, run.device).view(count, block_bytes)
            expected = torch.empty_like(src)
            if op is TransferOp.READ:
                expected[torch.from_numpy(lids).to(run.device)] = src[
                    torch.from_numpy(rids).to(run.device)
                ]
                ok = digest(run.kv[:span]) == digest(expected)
            else:
                expected.zero_()
                expected[torch.from_numpy(rids).to(run.device)] = src[
                    torch.from_numpy(lids).to(run.device)
                ]
                ok = run.ask("digest", (0, span)) == digest(expected)
            copy = torch_copy_seconds(run.device, src, lids, rids)
            gbps = span / min(seconds) / 1e9
            rows.append(
                Row(
                    f"{op.value} {order}",
                    f"{count} x {block_bytes >> 10} KiB",
                    ok,
                    gbps,
                    span / copy / 1e9,
                )
            )
    return rows


# -- fenced pushes -----------------------------------------------------------------------


class LateHostStream:
    """Host memory with a device's lateness (the dry run): a layer's copy is queued and runs
    only once a fence recorded after it completes, ``delay`` seconds after the record."""

    def __init__(self, name: str, delay: float) -> None:
        self.name, self.delay = name, delay
        self.queued: list[Callable[[], None]] = []
        self.ran = 0

    def run_until(self, count: int) -> None:
        while self.ran < count:
            self.queued[self.ran]()
            self.ran += 1

    def record(self) -> LateFence:
        return LateFence(self, len(self.queued), time.perf_counter() + self.delay)


class LateFence:
    def __init__(self, stream: LateHostStream, upto: int, due: float) -> None:
        self._stream, self._upto, self._due = stream, upto, due
        self.stream = stream.name

    def is_complete(self) -> bool:
        if time.perf_counter() < self._due:
            return False
        self._stream.run_until(self._upto)
        return True


class Streams:
    """Two streams of ``device`` (the dry run: late host streams, 30 and 10 ms behind)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cpu":
            self.late = [LateHostStream("s0", 0.03), LateHostStream("s1", 0.01)]
        else:
            self.cuda = [torch.cuda.Stream(device) for _ in range(2)]  # type: ignore[no-untyped-call]
            self.fences = TorchFences(device)

    def compute(self, index: int, out: torch.Tensor, src: torch.Tensor, spin: int) -> DeviceFence:
        """A 'kernel' that writes a layer's KV late on stream ``index``; the fence after it."""
        if self.device.type == "cpu":
            stream = self.late[index]
            stream.queued.append(lambda: out.copy_(src))
            return stream.record()
        with torch.cuda.stream(self.cuda[index]):
            if spin:
                torch.cuda._sleep(spin)
            out.copy_(src, non_blocking=True)
            fence = self.fences.record()
        assert fence is not None
        return fence

    def drain(self) -> None:
        if self.device.type == "cpu":
            for stream in self.late:
                stream.run_until(len(stream.queued))
        else:
            torch.cuda.synchronize(self.device)


def fenced_checks(run: Initiator, layers: int, delay: int) -> list[Row]:
    """WRITE ordering on one stream, then layers split over two streams, then a control that
    posts without waiting for the fences (its receiver must see the difference)."""
    rows = []
    device = run.device
    layer_bytes = run.nbytes // layers
    for check, split, fenced in (
        ("write ordering", False, True),
        ("two streams", True, True),
        ("fence control", False, False),
    ):
        streams = Streams(device)
        run.ask("zero")
        run.kv.zero_()
        synchronize(device)
        sources = [pattern(500 + layer, layer_bytes, device) for layer in range(layers)]
        synchronize(device)  # the inputs exist; what follows never waits for the device
        saves = FencedSaves()
        open_at_record = 0
        for layer in range(layers):
            out = run.kv[layer * layer_bytes : (layer + 1) * layer_bytes]
            spin = delay if layer == 0 else delay // 8
            fence = streams.compute(layer % 2 if split else 0, out, sources[layer], spin)
            open_at_record += not fence.is_complete()
            saves.add_layer(0, str(layer), fence)
            if not fenced:  # the control: pushed at once, whatever the device still does
                offset = np.array([layer * layer_bytes], dtype=np.int64)
                run.transfer(TransferOp.WRITE, offset, offset, layer_bytes)
        posted: list[int] = []
        deadline = time.perf_counter() + TIMEOUT
        while fenced and len(posted) < layers and time.perf_counter() < deadline:
            for item in saves.take_ready():
                assert isinstance(item, FencedLayer)
                layer = int(item.layer)
                offset = np.array([layer * layer_bytes], dtype=np.int64)
                run.transfer(TransferOp.WRITE, offset, offset, layer_bytes)
                posted.append(layer)
        streams.drain()
        same = run.ask("digest", (0, run.nbytes)) == digest(run.kv)
        if fenced:
            ok = len(posted) == layers and same and open_at_record > 0
            detail = f"{layers} layers, {open_at_record} fences open at record, order {posted}"
        else:
            ok = not same
            detail = "pushed before the fences: the receiver " + ("differs" if ok else "matched")
        rows.append(Row(check, detail, ok))
    return rows


def same_host_peer(device: torch.device, peer: str, nbytes: int) -> tuple[Peer, Initiator]:
    """The connector's engine (NIXL in same-host copies) and a peer process on ``peer``."""
    mapped = Initiator(device, peer, nbytes, loopback=False, same_host=True)
    side = Peer(
        device,
        mapped.engine,
        mapped.region,
        mapped.remote,
        mapped.kv,
        lambda seed, span: mapped.ask("fill", (seed, span)),
        lambda: mapped.ask("zero"),
        lambda start, stop: mapped.ask("digest", (start, stop)),
    )
    return side, mapped


def same_host_checks(
    device: torch.device, peer: str, nbytes: int, block: int, layers: int, batches: int
) -> list[Row]:
    """Same-host copies timed as users get them (:mod:`gpu_same_host`); on the CPU two
    engines of this process stand in for two processes."""
    if device.type == "cpu":
        side = in_process_peer(nbytes, pattern, digest)
        return same_host_timing(side, block, layers, batches, Row, pattern, digest)
    side, mapped = same_host_peer(device, peer, nbytes)
    try:
        rows = same_host_timing(side, block, layers, batches, Row, pattern, digest)
        batches_mapped = mapped.engine.mapped_batches
        rows.append(Row("same-host batches", f"{batches_mapped} by device copies", batches_mapped > 0))
    finally:
        mapped.close()
    return rows


# -- the protocols UCX chose -------------------------------------------------------------


def flush_c_stdio() -> None:
    ctypes.CDLL(None).fflush(None)


@contextmanager
def captured_output(path: str) -> Iterator[None]:
    """Send this process's (and its children's) stdout and stderr to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        flush_c_stdio()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for copy in saved:
            os.close(copy)


def protocol_rows(text: str) -> list[Row]:
    """One row per direction between device memories in UCX's protocol tables (the
    adapter's parser): a READ by software emulation fails; a direction without a table
    fails too (nothing was seen, so nothing was checked). Other lines are echoed."""
    chosen, other = parse_protocol_tables(text)
    for line in other:
        print(line, file=sys.stderr)
    rows = []
    for name in DIRECTIONS:
        found = DirectionProtocols(name, tuple(sorted(chosen[name])))
        level, message = protocol_advice(found)
        ok = bool(found.protocols) and level != "warning"
        rows.append(Row(f"{name} protocol", message, ok))
    return rows


# -- main --------------------------------------------------------------------------------


def print_table(rows: list[Row], label: str) -> None:
    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:8.2f}"

    print(f"\nmoriio GPU check ({label})")
    print(f"{'check':<{CHECK_WIDTH}} {'moriio GB/s':>11} {'torch GB/s':>10} {'result':>8}  detail")
    for row in rows:
        status = "ok" if row.ok else "MISMATCH"
        rates = f"{num(row.nixl_gbps):>11} {num(row.torch_gbps):>10}"
        print(f"{row.check:<{CHECK_WIDTH}} {rates} {status:>8}  {row.detail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="host memory, torch on the CPU")
    parser.add_argument("--mib", type=int, default=64, help="KV bytes per process (MiB)")
    parser.add_argument("--block-kib", type=int, default=64, help="block size (KiB)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per case")
    parser.add_argument("--layers", type=int, default=8, help="layers in the fenced checks")
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="bulk cases 1,024 x 64 KiB, 8,192 x 16 KiB and 8,192 x 64 KiB (512 MiB each side)",
    )
    parser.add_argument(
        "--batches", type=int, default=8, help="back-to-back batches per same-host case"
    )
    parser.add_argument(
        "--request-layers", type=int, default=61, help="layers of the same-host request case"
    )
    parser.add_argument(
        "--barrier-layers", type=int, default=61, help="layers of the graph barrier check"
    )
    parser.add_argument(
        "--inject-mismatch",
        action="store_true",
        help="corrupt one expected byte (checks the check)",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        device, peer, label = torch.device("cpu"), "cpu", "dry run: host memory, torch CPU"
    else:
        if not torch.cuda.is_available():
            print(
                "no CUDA device visible to torch (use --dry-run on a CPU machine)", file=sys.stderr
            )
            return 2
        device = torch.device("cuda", 0)
        peer = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
        runtime = f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        label = f"{torch.cuda.get_device_name(0)} -> {peer}, torch {torch.__version__}, {runtime}"
        torch.cuda.set_device(device)
    cases = [(64, 1024), (16, 8192), (64, 8192)] if args.matrix else [(args.block_kib, 0)]
    nbytes = max([args.mib << 20] + [(kib << 10) * count for kib, count in cases])
    proto_log = os.path.join(tempfile.gettempdir(), f"moriio-gpu-check-ucx-{os.getpid()}.log")
    capture = nullcontext() if args.dry_run else captured_output(proto_log)
    if not args.dry_run:
        os.environ.setdefault("UCX_PROTO_INFO", "y")  # informational: chooses nothing
    rows: list[Row] = []
    with capture:
        run = Initiator(device, peer, nbytes, loopback=args.dry_run)
        try:
            for kib, count in cases:
                count = count or nbytes // (kib << 10)
                rows += bulk_checks(run, kib << 10, count, args.rounds)
        except BaseException:
            run.close()
            raise
    if not args.dry_run:
        with open(proto_log, encoding="utf-8", errors="replace") as log_file:
            rows += protocol_rows(log_file.read())
    block = cases[-1][0] << 10
    rows += same_host_checks(device, peer, nbytes, block, args.request_layers, args.batches)
    try:
        rows += fenced_checks(run, args.layers, delay=0 if args.dry_run else 200_000_000)
        rows += barrier_checks(run, args.barrier_layers, 0.002, args.dry_run, Row)
        if args.inject_mismatch:
            run.kv[0] ^= 0xFF
            same = run.ask("digest", (0, nbytes)) == digest(run.kv)
            rows.append(Row("injected mismatch", "one byte flipped after the last push", same))
    finally:
        run.close()
    print_table(rows, label)
    failed = [row.check for row in rows if not row.ok]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
