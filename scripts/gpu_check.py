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
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moriio.adapters.nixl import NixlTransferEngine
from moriio.domain.worker.producer.write_fences import FencedLayer, FencedSaves
from moriio.ports import DeviceFence, MemoryKind, TransferOp, TransferState
from moriio.vllm_plugin.device import TorchFences, device_binder

TIMEOUT = 60.0  # seconds for one transfer or one fence


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


def target(conn: Any, device_name: str, nbytes: int, loopback: bool) -> None:
    """Registers a KV tensor, then serves commands: fill, digest, stop."""
    device = torch.device(device_name)
    bind = device_binder(device)
    if bind is not None:
        bind()
    kv = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    engine = NixlTransferEngine(loopback=loopback)
    kind, index = kind_of(device)
    region = engine.register_region(kv.data_ptr(), nbytes, kind, index)
    conn.send((engine.metadata(), region.descriptor))
    while True:
        engine.progress()
        if not conn.poll(0.0005):
            continue
        command, arg = conn.recv()
        if command == "fill":
            kv.copy_(pattern(arg, nbytes, device))
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


# -- the initiator -----------------------------------------------------------------------


class Initiator:
    def __init__(self, device: torch.device, peer_device: str, nbytes: int, loopback: bool):
        self.device, self.nbytes = device, nbytes
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, peer_device, nbytes, loopback))
        self.proc.start()
        if not self.conn.poll(TIMEOUT):
            raise RuntimeError("the target process did not register its tensor in time")
        metadata, descriptor = self.conn.recv()
        self.kv = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.engine = NixlTransferEngine(loopback=loopback)
        kind, index = kind_of(device)
        self.region = self.engine.register_region(self.kv.data_ptr(), nbytes, kind, index)
        self.remote = self.engine.import_region(self.engine.add_peer(metadata), descriptor)

    def ask(self, command: str, arg: Any = None) -> Any:
        self.conn.send((command, arg))
        return self.conn.recv()

    def transfer(self, op: TransferOp, local: np.ndarray, remote: np.ndarray, size: int) -> float:
        """One batch of ``size``-byte blocks; seconds from post to completion."""
        sizes = np.full(len(local), size, dtype=np.int64)
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


def bulk_checks(run: Initiator, block_bytes: int, rounds: int) -> list[Row]:
    rows = []
    count = run.nbytes // block_bytes
    for op in (TransferOp.READ, TransferOp.WRITE):
        for order in ("contiguous", "random"):
            lids, rids = blocks(order, count, seed=11)
            local_off, remote_off = lids * block_bytes, rids * block_bytes
            seconds = []
            for attempt in range(rounds + 1):
                seed = 100 + attempt
                if op is TransferOp.READ:
                    run.ask("fill", seed)
                    run.kv.zero_()
                else:
                    run.kv.copy_(pattern(seed, run.nbytes, run.device))
                    run.ask("zero")
                synchronize(run.device)
                elapsed = run.transfer(op, local_off, remote_off, block_bytes)
                if attempt:
                    seconds.append(elapsed)
            src = pattern(100 + rounds, run.nbytes, run.device).view(count, block_bytes)
            expected = torch.empty_like(src)
            if op is TransferOp.READ:
                expected[torch.from_numpy(lids).to(run.device)] = src[
                    torch.from_numpy(rids).to(run.device)
                ]
                ok = digest(run.kv) == digest(expected)
            else:
                expected.zero_()
                expected[torch.from_numpy(rids).to(run.device)] = src[
                    torch.from_numpy(lids).to(run.device)
                ]
                ok = run.ask("digest", (0, run.nbytes)) == digest(expected)
            copy = torch_copy_seconds(run.device, src, lids, rids)
            gbps = run.nbytes / min(seconds) / 1e9
            rows.append(
                Row(
                    f"{op.value} {order}",
                    f"{count} x {block_bytes} B",
                    ok,
                    gbps,
                    run.nbytes / copy / 1e9,
                )
            )
    return rows


# -- fenced pushes -----------------------------------------------------------------------


class HostFence:
    """Host memory: the work is done when the hook runs (the fence is born complete)."""

    def __init__(self, stream: str) -> None:
        self.stream = stream

    def is_complete(self) -> bool:
        return True


def fence_source(device: torch.device) -> Callable[[str], DeviceFence]:
    if device.type == "cpu":
        return HostFence
    fences = TorchFences(device)
    return lambda _stream: fences.record()  # type: ignore[return-value]


def compute_layer(device: torch.device, out: torch.Tensor, src: torch.Tensor, delay: int) -> None:
    """A 'kernel' that writes a layer's KV late: it spins on the device, then copies."""
    if device.type != "cpu" and delay:
        torch.cuda._sleep(delay)
    out.copy_(src, non_blocking=True)


def fenced_checks(run: Initiator, layers: int, delay: int) -> list[Row]:
    """WRITE ordering on one stream, then layers split over two streams."""
    rows = []
    device = run.device
    record = fence_source(device)
    layer_bytes = run.nbytes // layers
    on_device = device.type != "cpu"
    streams = [torch.cuda.Stream(device) for _ in range(2)] if on_device else [None, None]
    for check, split in (("write ordering", False), ("two streams", True)):
        run.ask("zero")
        run.kv.zero_()
        synchronize(device)
        sources = [pattern(500 + layer, layer_bytes, device) for layer in range(layers)]
        synchronize(device)  # the inputs exist; what follows never waits for the device
        saves = FencedSaves()
        open_at_record = 0
        for layer in range(layers):
            stream = streams[layer % 2 if split else 0]
            out = run.kv[layer * layer_bytes : (layer + 1) * layer_bytes]
            context = torch.cuda.stream(stream) if stream is not None else nullcontext()
            with context:
                spin = delay if layer == 0 else delay // 8
                compute_layer(device, out, sources[layer], spin)
                fence = record(f"s{layer % 2 if split else 0}")
            open_at_record += not fence.is_complete()
            saves.add_layer(0, str(layer), fence)
        posted: list[int] = []
        deadline = time.perf_counter() + TIMEOUT
        while len(posted) < layers and time.perf_counter() < deadline:
            for item in saves.take_ready():
                assert isinstance(item, FencedLayer)
                layer = int(item.layer)
                offset = np.array([layer * layer_bytes], dtype=np.int64)
                run.transfer(TransferOp.WRITE, offset, offset, layer_bytes)
                posted.append(layer)
        synchronize(device)
        ok = len(posted) == layers and run.ask("digest", (0, run.nbytes)) == digest(run.kv)
        detail = f"{layers} layers, {open_at_record} fences open at record, order {posted}"
        rows.append(Row(check, detail, ok))
    return rows


# -- main --------------------------------------------------------------------------------


def print_table(rows: list[Row], label: str) -> None:
    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:8.2f}"

    print(f"\nmoriio GPU check ({label})")
    print(f"{'check':<18} {'NIXL GB/s':>9} {'torch GB/s':>10} {'result':>8}  detail")
    for row in rows:
        status = "ok" if row.ok else "MISMATCH"
        rates = f"{num(row.nixl_gbps):>9} {num(row.torch_gbps):>10}"
        print(f"{row.check:<18} {rates} {status:>8}  {row.detail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="host memory, torch on the CPU")
    parser.add_argument("--mib", type=int, default=64, help="KV bytes per process (MiB)")
    parser.add_argument("--block-kib", type=int, default=64, help="block size (KiB)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per case")
    parser.add_argument("--layers", type=int, default=8, help="layers in the fenced checks")
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
        label = f"{torch.cuda.get_device_name(0)} -> {peer}, torch {torch.__version__}"
        torch.cuda.set_device(device)
    nbytes = args.mib << 20
    run = Initiator(device, peer, nbytes, loopback=args.dry_run)
    try:
        rows = bulk_checks(run, args.block_kib << 10, args.rounds)
        rows += fenced_checks(run, args.layers, delay=0 if args.dry_run else 200_000_000)
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
