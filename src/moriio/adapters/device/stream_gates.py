"""Layer gates on a CUDA or ROCm stream, which CUDA graphs capture.

Each gate is a 32-bit flag in pinned host memory (the device reads it over the bus while it
waits; the host opens it with a plain store). A forward's stream waits on a gate with the
driver's stream memory operation ``cuStreamWaitValue32`` (HIP: ``hipStreamWaitValue32``)
until bit 0 is set; closing a gate is a ``cuStreamWriteValue32`` queued on the same stream,
so it takes effect after the forwards queued before it and before the next one.

A closing writes ``2 * n`` (its number n in the upper bits, bit 0 clear); the host opens the
gate for closing n by swapping ``2 * n`` for ``2 * n + 1`` (one atomic compare-and-swap,
:mod:`~moriio.adapters.device.host_atomics`): until the flag reads ``2 * n`` closing n has
not run on the stream, and opening early would be undone by it; were a later closing to
land between a read and a write, a plain store would open a gate a later forward waits on.
A gate whose flag shows a later closing was never waited on by closing n's forward: nothing
to open. The numbers compare modulo 2**32, which holds while fewer than 2**30 closings are
outstanding.

Closings are queued on the stream current when the forward is armed; a layer's wait queued
on another stream (micro-batches) first makes that stream wait for the closing, so no
stream passes a gate on an opening meant for an earlier forward.

The driver is called through ctypes (libcuda / libamdhip64), so no extra package is
needed. :func:`probe_stream_gates` checks, on the device, that the calls work and that a
graph captures and replays them; where they do not, the worker waits on the host instead.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch

from moriio.adapters.device.host_atomics import HostAtomics

WAIT_AND = 0x2  # CU_STREAM_WAIT_VALUE_AND, hipStreamWaitValueAnd: until (*addr & value) != 0
WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: until (int32_t)(*addr - value) >= 0
WRITE_DEFAULT = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT, hipStreamWriteValue32's flags
OPEN_BIT = 1
_MASK = 0xFFFFFFFF
_FLAG_BYTES = 4


class StreamMemOps(Protocol):
    """The two stream memory operations the gates use (a raw stream handle and address)."""

    def wait_any_bit(self, stream: int, address: int, bits: int) -> None:
        """Queue on ``stream``: wait until the 32-bit word at ``address`` has one of ``bits``."""
        ...

    def write(self, stream: int, address: int, value: int) -> None:
        """Queue on ``stream``: write ``value`` to the 32-bit word at ``address``."""
        ...

    def order_after(self, stream: int, other: int) -> None:
        """Queue on ``stream``: wait for the work queued on ``other`` so far."""
        ...

    def wait_at_least(self, stream: int, address: int, value: int) -> None:
        """Queue on ``stream``: wait until the word at ``address`` minus ``value`` is not
        negative as a signed 32-bit number (a cyclic comparison)."""
        ...


class CopyOpener(Protocol):
    """The same-host engine: runs stream operations right after a set of its copies."""

    def after_copies(self, tags: frozenset[str], queue: Callable[[int], None]) -> bool: ...


class DriverError(RuntimeError):
    """A stream memory operation was refused by the driver."""


def _checked(name: str, code: int) -> None:
    if code != 0:
        raise DriverError(f"{name} failed with driver status {code}")


class CudaMemOps:
    """``cuStreamWaitValue32`` / ``cuStreamWriteValue32`` from libcuda."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        lib = ctypes.CDLL(library)
        self._wait = _function(lib, "cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        self._write = _function(lib, "cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        for fn in (self._wait, self._write):
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int

    def wait_any_bit(self, stream: int, address: int, bits: int) -> None:
        _checked("cuStreamWaitValue32", self._wait(stream, address, bits, WAIT_AND))

    def write(self, stream: int, address: int, value: int) -> None:
        _checked("cuStreamWriteValue32", self._write(stream, address, value, WRITE_DEFAULT))

    def order_after(self, stream: int, other: int) -> None:
        _order_after(stream, other)

    def wait_at_least(self, stream: int, address: int, value: int) -> None:
        _checked("cuStreamWaitValue32", self._wait(stream, address, value, WAIT_GEQ))


class HipMemOps:
    """``hipStreamWaitValue32`` / ``hipStreamWriteValue32`` from libamdhip64."""

    def __init__(self, library: str = "libamdhip64.so") -> None:
        lib = ctypes.CDLL(library)
        self._wait = _function(lib, "hipStreamWaitValue32")
        self._wait.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_uint,
            ctypes.c_uint32,
        ]
        self._write = _function(lib, "hipStreamWriteValue32")
        self._write.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint]
        for fn in (self._wait, self._write):
            fn.restype = ctypes.c_int

    def wait_any_bit(self, stream: int, address: int, bits: int) -> None:
        _checked("hipStreamWaitValue32", self._wait(stream, address, bits, WAIT_AND, _MASK))

    def write(self, stream: int, address: int, value: int) -> None:
        _checked("hipStreamWriteValue32", self._write(stream, address, value, WRITE_DEFAULT))

    def order_after(self, stream: int, other: int) -> None:
        _order_after(stream, other)

    def wait_at_least(self, stream: int, address: int, value: int) -> None:
        """hipStreamWaitValueGte compares ``(*addr & mask) >= value``, not cyclically: the
        host opens the gates instead."""
        raise DriverError("hipStreamWaitValue32 has no cyclic comparison")


def _order_after(stream: int, other: int) -> None:
    """An event recorded on ``other`` that ``stream`` waits for (torch drives the driver)."""
    torch.cuda.ExternalStream(stream).wait_stream(torch.cuda.ExternalStream(other))  # type: ignore[no-untyped-call]


def _function(lib: ctypes.CDLL, *names: str) -> Any:
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    raise DriverError(f"{lib._name} has none of {', '.join(names)}")


def _signed(value: int) -> int:
    """``value`` modulo 2**32 as a signed 32-bit number."""
    value &= _MASK
    return value - (1 << 32) if value >= 1 << 31 else value


class StreamGates:
    """:class:`~moriio.ports.LayerGates` over 32-bit flags at ``address`` (``flags`` is the
    host's view of the same memory), on the stream ``stream()`` returns. ``owner`` keeps
    the memory behind ``address`` alive as long as the gates."""

    def __init__(
        self,
        ops: StreamMemOps,
        flags: np.ndarray,
        address: int,
        stream: Callable[[], int],
        owner: object = None,
        *,
        atomics: HostAtomics | None = None,
        capturing: Callable[[], bool] = lambda: False,
    ) -> None:
        """``atomics``: the host's compare-and-swap (libatomic's by default);
        ``capturing``: whether the calling thread's stream is being captured."""
        if flags.dtype != np.uint32:
            raise ValueError(f"gate flags must be uint32, got {flags.dtype}")
        self._ops = ops
        self._flags = flags
        self._address = address
        self._stream = stream
        self._owner = owner
        self._atomics = atomics or HostAtomics()
        self._capturing = capturing
        self._closings = 0
        self._opener: CopyOpener | None = None
        self._closed_on: int | None = None  # the stream of the latest closing
        self._ordered: set[int] = set()  # streams ordered after the latest closing
        flags[:] = OPEN_BIT  # closing 0, open

    @property
    def count(self) -> int:
        return len(self._flags)

    def close_all(self) -> int:
        self._closings += 1
        value = (2 * self._closings) & _MASK
        stream = self._stream()
        for index in range(self.count):
            self._ops.write(stream, self._address + _FLAG_BYTES * index, value)
        self._closed_on, self._ordered = stream, {stream}
        return self._closings

    def try_open(self, index: int, closing: int) -> bool:
        closed = (2 * closing) & _MASK
        ahead = _signed(int(self._flags[index]) - closed)
        if ahead < 0:
            return False  # the closing has not run on the stream yet
        if ahead == 0:
            word = self._flags.ctypes.data + _FLAG_BYTES * index
            seen = self._atomics.compare_exchange(word, closed, closed | OPEN_BIT)
            if _signed(seen - closed) < 0:
                return False
        return True

    def enqueue_wait(self, index: int) -> None:
        stream = self._stream()
        closed_on = self._closed_on
        if closed_on is not None and stream not in self._ordered and not self._capturing():
            self._ops.order_after(stream, closed_on)
            self._ordered.add(stream)
        self._ops.wait_any_bit(stream, self._address + _FLAG_BYTES * index, OPEN_BIT)

    def attach(self, opener: CopyOpener) -> None:
        """The engine whose copies may open gates on the device (:meth:`open_after_copies`)."""
        self._opener = opener

    def open_after_copies(self, closing: int, batches: Mapping[int, frozenset[str]]) -> int:
        """For each gate whose layer is filled only by copies of the attached engine, queue
        on the device, after those copies: wait until ``closing`` ran, open the gate. The
        layer's copies complete after that, so the host never finds them done with the gate
        still shut; its own opening then finds the gate open. Returns the gates queued."""
        if self._opener is None:
            return 0
        closed = (2 * closing) & _MASK
        queued = 0
        for index, tags in batches.items():
            address = self._address + _FLAG_BYTES * index

            def queue(stream: int, address: int = address) -> None:
                self._ops.wait_at_least(stream, address, closed)
                self._ops.write(stream, address, closed | OPEN_BIT)

            try:
                queued += self._opener.after_copies(tags, queue)
            except DriverError:
                return queued
        return queued

    def open_all(self) -> None:
        """Open every gate for the latest closing (and so for every earlier one)."""
        self._flags[:] = (2 * self._closings + OPEN_BIT) & _MASK


def mem_ops() -> StreamMemOps:
    if torch.version.hip is not None:
        return HipMemOps()
    return CudaMemOps()


def probe_stream_gates(device: torch.device, count: int) -> StreamGates | str:
    """Gates for ``count`` layers on ``device``'s current streams, or why there can be none:
    the driver lacks stream memory operations, refuses them, or a graph cannot capture and
    replay them. Runs a few microseconds of device work, once, at start-up."""
    if device.type != "cuda":
        return f"{device.type} devices have no stream memory operations here"
    try:
        ops = mem_ops()
        HostAtomics()  # the host's compare-and-swap, or why there is none
        flags = torch.zeros(count, dtype=torch.int32, pin_memory=True)
        _self_test(ops, device)
    except (OSError, DriverError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    view = flags.numpy().view(np.uint32)
    return StreamGates(
        ops, view, flags.data_ptr(), lambda: _current_handle(device), flags, capturing=is_capturing
    )


def _current_handle(device: torch.device) -> int:
    return int(torch.cuda.current_stream(device).cuda_stream)


def is_capturing() -> bool:
    """Whether the calling thread's current stream is being captured into a graph."""
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _self_test(ops: StreamMemOps, device: torch.device) -> None:
    """A write and a wait on a side stream, then the same wait captured and replayed."""
    scratch = torch.zeros(2, dtype=torch.int32, pin_memory=True)
    word = scratch.numpy().view(np.uint32)
    address = scratch.data_ptr()
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    ops.write(int(stream.cuda_stream), address, 2)
    stream.synchronize()
    if int(word[0]) != 2:
        raise DriverError(f"a stream write left {int(word[0])}, not 2, in host memory")
    word[0] = 3
    ops.wait_any_bit(int(stream.cuda_stream), address, OPEN_BIT)
    stream.synchronize()
    out = torch.zeros(1, dtype=torch.int32, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        ops.wait_any_bit(int(torch.cuda.current_stream(device).cuda_stream), address, OPEN_BIT)
        out.add_(1)
    graph.replay()
    torch.cuda.synchronize(device)
    if int(out.item()) != 1:
        raise DriverError("a captured wait did not replay")
