"""Which protocol UCX takes for device memory, per direction, where users run.

UCX prints the protocols it selects when ``UCX_PROTO_INFO=y``: one table per operation,
titled e.g. ``remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1]``, one
row per message size range (``| 0..inf | zero-copy | cuda_ipc/cuda |``). A READ of device
memory by ``software emulation`` (over TCP) runs at about 1/500 of the device (0.45 GB/s on
an H200); with ``UCX_PROTO_EMULATION_ENABLE=n`` it is refused instead, and NIXL reports the
refusal as a remote disconnect.

:func:`probe_device_protocols` moves one block each way between two agents of this process
(a same-host peer's path) with the tables switched on and their output captured, and
returns, per direction, the protocols seen and whether the batch failed.
:func:`protocol_advice` turns that into a log level and a sentence with the fix.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from moriio.adapters.nixl.failures import (
    EMULATION_VARIABLE,
    GET_ZCOPY_VARIABLE,
    emulation_forbidden,
)
from moriio.ports import MemoryKind, TransferEngine, TransferOp, TransferState

PROBE_BYTES = 64 << 10
PROBE_TIMEOUT = 5.0  # seconds for each probe batch
DIRECTIONS = ("read", "write")

# (address, device id, what keeps the memory alive) of ``nbytes`` of device memory
Scratch = Callable[[int], tuple[int, int, object]]


@dataclass(frozen=True, slots=True)
class DirectionProtocols:
    """What UCX chose for one direction of device memory; ``failure``: the probe's batch
    failed (NIXL's message), "" when it moved."""

    direction: str
    protocols: tuple[str, ...]
    failure: str = ""

    @property
    def emulated(self) -> bool:
        return any("emulation" in p for p in self.protocols)


def parse_protocol_tables(text: str) -> tuple[dict[str, set[str]], list[str]]:
    """The protocols of each direction between device memories in UCX's tables (a READ
    into device memory, a WRITE from it), and the lines that are not UCX's tables."""
    chosen: dict[str, set[str]] = {name: set() for name in DIRECTIONS}
    other: list[str] = []
    direction: str | None = None
    for line in text.splitlines():
        bar = line.find("|")
        if bar < 0:
            if not line.lstrip().startswith("[") and line.strip():
                other.append(line)
            continue
        cells = [cell.strip() for cell in line[bar:].strip().strip("|").split("|")]
        if len(cells) == 1:  # a table's title: what the protocols are for
            title = cells[0]
            if "remote memory read" in title and "into cuda" in title:
                direction = "read"
            elif "remote memory write" in title and "from cuda" in title:
                direction = "write"
            elif "remote memory" in title or "active message" in title:
                direction = None
            continue
        if direction and len(cells) >= 3 and cells[1] and cells[1] != "Description":
            chosen[direction].add(f"{cells[1]} ({cells[2]})")
    return chosen, other


def protocol_advice(
    found: DirectionProtocols, environ: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """("info" | "warning", what to tell the operator) for one direction."""
    env = os.environ if environ is None else environ
    name = f"device {found.direction.upper()}s"
    fix = f"set {GET_ZCOPY_VARIABLE}=y (moriio's default when unset)"
    if env.get(GET_ZCOPY_VARIABLE, "").strip().lower() in {"y", "yes", "1", "on", "true"}:
        fix = "check that UCX_TLS keeps cuda_ipc and that the KV memory is exportable"
    if found.failure:
        if emulation_forbidden(env):
            return "warning", (
                f"{name} are refused: UCX has no zero-copy protocol for them and "
                f"{EMULATION_VARIABLE}={env[EMULATION_VARIABLE]} forbids its software "
                f"emulation; {fix}, or allow emulation (slow) ({found.failure})"
            )
        return "warning", f"{name} failed in a same-process probe: {found.failure}"
    if not found.protocols:
        return "info", f"{name}: UCX printed no protocol table (the probe moved its block)"
    chosen = "; ".join(found.protocols)
    if found.emulated and found.direction == "read":
        return "warning", (
            f"{name} take UCX's software emulation ({chosen}): about 1/500 of the device's "
            f"speed; {fix}"
        )
    return "info", f"{name}: {chosen}"


@contextmanager
def captured_output(path: str) -> Iterator[None]:
    """Send this process's stdout and stderr (the C library's too) to ``path``."""
    import ctypes

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
        ctypes.CDLL(None).fflush(None)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for copy in saved:
            os.close(copy)


def _move_one_block(
    reader: TransferEngine, writer: TransferEngine, scratch: Scratch, timeout: float
) -> dict[str, str]:
    """Post one READ and one WRITE of device memory; each direction's failure ("": moved)."""
    mine, theirs = scratch(PROBE_BYTES), scratch(PROBE_BYTES)
    local = reader.register_region(mine[0], PROBE_BYTES, MemoryKind.DEVICE, mine[1])
    region = writer.register_region(theirs[0], PROBE_BYTES, MemoryKind.DEVICE, theirs[1])
    remote = reader.import_region(reader.add_peer(writer.metadata()), region.descriptor)
    writer.add_peer(reader.metadata())
    offsets, sizes = np.zeros(1, np.int64), np.full(1, PROBE_BYTES, np.int64)
    failures = {}
    for direction, op in zip(DIRECTIONS, (TransferOp.READ, TransferOp.WRITE), strict=True):
        handle = reader.post(op, local, remote, offsets, offsets, sizes, f"probe/{direction}")
        deadline = time.monotonic() + timeout
        status = reader.poll(handle)
        while status.state is TransferState.IN_PROGRESS and time.monotonic() < deadline:
            writer.progress()
            status = reader.poll(handle)
        if status.state is TransferState.SUCCEEDED:
            failures[direction] = ""
        else:
            failures[direction] = status.message or f"still {status.state.value} after {timeout} s"
    return failures


def probe_device_protocols(
    scratch: Scratch,
    engine: Callable[[], TransferEngine],
    *,
    timeout: float = PROBE_TIMEOUT,
) -> list[DirectionProtocols]:
    """One block each way between two engines ``engine()`` makes, with UCX's tables on
    (``UCX_PROTO_INFO=y`` while they start) and this process's output captured meanwhile;
    lines that are not tables are written back to stderr."""
    with tempfile.NamedTemporaryFile(prefix="moriio-ucx-", suffix=".log", delete=False) as f:
        path = f.name
    previous = os.environ.get("UCX_PROTO_INFO")
    os.environ["UCX_PROTO_INFO"] = "y"
    engines: list[TransferEngine] = []
    try:
        with captured_output(path):
            try:
                engines = [engine(), engine()]
                failures = _move_one_block(engines[0], engines[1], scratch, timeout)
            finally:
                for made in engines:
                    made.close()
    finally:
        if previous is None:
            os.environ.pop("UCX_PROTO_INFO", None)
        else:
            os.environ["UCX_PROTO_INFO"] = previous
    with open(path, encoding="utf-8", errors="replace") as log:
        chosen, other = parse_protocol_tables(log.read())
    os.unlink(path)
    for line in other:
        print(line, file=sys.stderr)
    return [
        DirectionProtocols(name, tuple(sorted(chosen[name])), failures.get(name, ""))
        for name in DIRECTIONS
    ]
