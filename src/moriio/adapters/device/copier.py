"""Batches of scattered copies between two memories of one device, on the copier's stream.

A batch becomes equal rows (:mod:`~moriio.adapters.device.rows`) moved by one kernel launch
(:mod:`~moriio.adapters.device.kernels`); a batch of few descriptors is copied descriptor by
descriptor (a plain device memcpy each). A batch posted from the thread that built the
copier (the worker's, which queues the forwards) first makes the copier's stream wait for
the work queued so far on that thread's current stream, so a copy never overtakes a kernel
queued before it on the blocks it writes. Batches posted from other threads (a read resumed
after a handshake) are not ordered so: a forward queued since may be waiting on a layer
gate that only their copy lets open.
Completion is an event on the copier's stream: nothing waits on the host. A launch that
fails (out of memory, a driver error) completes as a failed batch instead of raising.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from moriio.adapters.device.kernels import DeviceRows, RowKernel, row_kernel, upload
from moriio.adapters.device.rows import Int64s, coalesced, unit_plan

MEMCPY_DESCRIPTORS = 8  # at most this many: one memcpy each
PREPARED_BATCHES = 64  # read-only batches whose rows and device indices are kept
PREPARED_BYTES = 64 << 20  # and at most this many bytes of device indices for them


class Completion(Protocol):
    """What completes with a queued batch. ``error``: why it failed ("" when it did not)."""

    error: str

    def query(self) -> bool:
        """Whether every kernel queued for the batch has run (never blocks)."""
        ...


@dataclass(slots=True)
class Done:
    """A batch already complete: host memory, where the copy ran in the call."""

    error: str = ""

    def query(self) -> bool:
        return True


@dataclass(slots=True)
class EventCompletion:
    event: Any
    error: str = ""

    def query(self) -> bool:
        return bool(self.event.query())


class CopyStream(Protocol):
    """Where a copier's launches run and how their completion is known."""

    handle: int  # the raw stream (for stream memory operations), 0 on the host

    def order_after_caller(self) -> None:
        """Make this stream wait for the work queued so far on the calling thread's
        current stream."""
        ...

    def submit(self, launch: Callable[[], None]) -> Completion:
        """Run ``launch`` on this stream after the work queued so far on the calling
        thread's current stream; what completes with it."""
        ...

    def marker(self) -> Completion:
        """A completion after everything queued on this stream so far."""
        ...

    def order_after(self, other: CopyStream) -> None:
        """Make this stream wait for the work queued on ``other`` so far."""
        ...


class HostStream:
    """Host memory: launches run in the calling thread."""

    handle = 0

    def order_after_caller(self) -> None:
        return None

    def submit(self, launch: Callable[[], None]) -> Completion:
        launch()
        return Done()

    def marker(self) -> Completion:
        return Done()

    def order_after(self, other: CopyStream) -> None:
        return None


class TorchStream:
    """A stream of its own on ``device`` (CUDA, ROCm)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.handle = int(self.stream.cuda_stream)

    def order_after_caller(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def submit(self, launch: Callable[[], None]) -> Completion:
        with torch.cuda.stream(self.stream):
            launch()
        return self.marker()

    def marker(self) -> Completion:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self.stream)
        return EventCompletion(event)

    def order_after(self, other: CopyStream) -> None:
        self.stream.wait_stream(getattr(other, "stream", torch.cuda.current_stream(self.device)))


def _stream(device: torch.device) -> CopyStream:
    return HostStream() if device.type == "cpu" else TorchStream(device)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A batch ready to launch: memcpy descriptors, or rows with their device indices."""

    memcpy: list[tuple[int, int, int]]  # (dst, src, bytes)
    rows: DeviceRows | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.rows is None else self.rows.nbytes


class DeviceCopier:
    """Copies on its own stream of ``device`` (host memory: in the calling thread).

    A batch whose offset arrays are read-only (the planner's plans are frozen, and every
    layer of one geometry posts the same plan) is prepared once: its rows and device
    indices are kept for the next post of the same arrays (:data:`PREPARED_BATCHES` and
    :data:`PREPARED_BYTES` kept).
    """

    def __init__(
        self,
        device: torch.device,
        *,
        kernel: RowKernel | None = None,
        stream: CopyStream | None = None,
        gate_stream: CopyStream | None = None,
        memcpy_descriptors: int = MEMCPY_DESCRIPTORS,
    ) -> None:
        """``gate_stream``: where work that must follow copies but not hold up later ones
        runs (layer gates opened after a layer's copies); a stream of its own by default."""
        self.device = device
        self.kernel = kernel or row_kernel(device)
        self.stream = stream or _stream(device)
        self._gate_stream = gate_stream
        self.memcpy_descriptors = memcpy_descriptors
        self._owner_thread = threading.get_ident()
        self._prepared: OrderedDict[tuple[int, ...], tuple[tuple[Any, ...], _Prepared]] = (
            OrderedDict()
        )
        self._prepared_bytes = 0
        self.batches = 0
        self.kernels = 0
        self.prepared_hits = 0
        self.failures = 0

    def copy(
        self,
        dst: torch.Tensor,
        src: torch.Tensor,
        dst_offsets: Int64s,
        src_offsets: Int64s,
        sizes: Int64s,
    ) -> Completion:
        """Queue the batch; what completes with it (failed, not raised, when a launch fails)."""
        self.batches += 1

        def launch() -> None:
            self._launch(dst, src, self._prepare(dst_offsets, src_offsets, sizes))

        try:
            if threading.get_ident() == self._owner_thread:
                self.stream.order_after_caller()
            return self.stream.submit(launch)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError, driver errors
            self.failures += 1
            return self._failed(f"device copy failed: {type(exc).__name__}: {exc}")

    def after_copies(self, queue: Callable[[int], None]) -> Completion:
        """Run ``queue(stream handle)`` (stream memory operations) on the gate stream after
        every copy queued so far; what completes after it. Later copies never wait for it."""
        if self._gate_stream is None:
            self._gate_stream = _stream(self.device)
        gates = self._gate_stream
        gates.order_after(self.stream)
        queue(gates.handle)
        return gates.marker()

    def _failed(self, reason: str) -> Completion:
        """A failed batch, complete once whatever it queued before failing has run."""
        try:
            marker = self.stream.marker()
        except RuntimeError:  # the device refuses even an event: nothing more runs there
            marker = Done()
        marker.error = reason
        return marker

    def _prepare(self, dst_off: Int64s, src_off: Int64s, sizes: Int64s) -> _Prepared:
        arrays = (dst_off, src_off, sizes)
        frozen = not any(a.flags.writeable for a in arrays)
        key = tuple(id(a) for a in arrays)
        if frozen:
            cached = self._prepared.get(key)
            if cached is not None and all(r() is a for r, a in zip(cached[0], arrays, strict=True)):
                self._prepared.move_to_end(key)
                self.prepared_hits += 1
                return cached[1]
        prepared = self._plan(dst_off, src_off, sizes)
        if frozen:
            self._keep(key, tuple(weakref.ref(a) for a in arrays), prepared)
        return prepared

    def _keep(self, key: tuple[int, ...], refs: tuple[Any, ...], prepared: _Prepared) -> None:
        self._prepared[key] = (refs, prepared)
        self._prepared_bytes += prepared.nbytes
        while self._prepared and (
            len(self._prepared) > PREPARED_BATCHES or self._prepared_bytes > PREPARED_BYTES
        ):
            _, (_, dropped) = self._prepared.popitem(last=False)
            self._prepared_bytes -= dropped.nbytes

    def _plan(self, dst_off: Int64s, src_off: Int64s, sizes: Int64s) -> _Prepared:
        src_off, dst_off, sizes = coalesced(src_off, dst_off, sizes)
        few = len(sizes) <= self.memcpy_descriptors
        plan = None if few else unit_plan(src_off, dst_off, sizes)
        if plan is None:
            triples = zip(dst_off.tolist(), src_off.tolist(), sizes.tolist(), strict=True)
            return _Prepared(list(triples))
        return _Prepared([], upload(plan, self.device, self.kernel.index_dtype))

    def _launch(self, dst: torch.Tensor, src: torch.Tensor, prepared: _Prepared) -> None:
        for d, s, n in prepared.memcpy:
            dst[d : d + n].copy_(src[s : s + n], non_blocking=True)
            self.kernels += 1
        if prepared.rows is not None:
            self.kernels += self.kernel.launch(dst, src, prepared.rows)
