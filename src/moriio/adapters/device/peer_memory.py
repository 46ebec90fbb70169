"""Device memory shared with another process on the same host (CUDA / HIP IPC), through the
driver with ctypes: export a pointer's allocation as a handle, map a peer's handle; and
tensors over raw addresses.

A handle names a whole allocation; an export carries the pointer's offset in it. Mapping
the same handle twice maps it once (counted), since vLLM's KV layers are views of one
allocation.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

HANDLE_BYTES = 64  # CUipcMemHandle and hipIpcMemHandle_t
LAZY_ENABLE_PEER_ACCESS = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, hipIpcMemLazyEnablePeerAccess


class PeerMemoryError(RuntimeError):
    """The driver refused to export or map device memory."""


@dataclass(frozen=True, slots=True)
class Export:
    """What a peer on this host needs to map ``[address, address + length)``."""

    handle: bytes
    offset: int  # of the address in the handle's allocation


class PeerMemory(Protocol):
    def export(self, address: int) -> Export:
        """The handle of the allocation ``address`` lies in, and its offset there."""
        ...

    def open(self, handle: bytes) -> int:
        """Map a peer's allocation; returns its base address here (counted per handle)."""
        ...

    def close(self, handle: bytes) -> None:
        """Undo one :meth:`open` of ``handle``; unmapped when the last one is undone."""
        ...


class _Cuda:
    """``__cuda_array_interface__`` of raw device bytes, for ``torch.as_tensor``."""

    def __init__(self, address: int, length: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (length,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
        }


def byte_view(address: int, length: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over ``length`` bytes at ``address`` of ``device``, never a copy.

    torch places a device pointer on the device the driver says it belongs to, and asked
    for another device it copies (or, in some versions, relabels): a pointer that is not
    ``device``'s is refused here instead (PeerMemoryError).
    """
    if device.type == "cpu":
        array = np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(address))
        return torch.from_numpy(array)
    view = torch.as_tensor(_Cuda(address, length))
    index = 0 if device.index is None else device.index
    if view.device.type != device.type or view.device.index != index:
        raise PeerMemoryError(f"memory at {address:#x} belongs to {view.device}, not {device}")
    if view.data_ptr() != address or view.numel() != length:
        raise PeerMemoryError(f"torch copied the memory at {address:#x} instead of viewing it")
    return view


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * HANDLE_BYTES)]


class DriverPeerMemory:
    """:class:`PeerMemory` over libcuda (``cuIpc*``) or libamdhip64 (``hipIpc*``)."""

    def __init__(self, hip: bool) -> None:
        if hip:
            lib = ctypes.CDLL("libamdhip64.so")
            names = ("hipIpcGetMemHandle", "hipIpcOpenMemHandle", "hipIpcCloseMemHandle")
            self._range = lib.hipMemGetAddressRange
        else:
            lib = ctypes.CDLL("libcuda.so.1")
            names = ("cuIpcGetMemHandle", "cuIpcOpenMemHandle_v2", "cuIpcCloseMemHandle")
            self._range = lib.cuMemGetAddressRange_v2
        self._get, self._open, self._close = (getattr(lib, name) for name in names)
        self._hip = hip
        self._get.argtypes = [ctypes.POINTER(_Handle), ctypes.c_uint64]
        self._open.argtypes = [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]
        self._close.argtypes = [ctypes.c_uint64]
        self._range.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_uint64,
        ]
        for fn in (self._get, self._open, self._close, self._range):
            fn.restype = ctypes.c_int
        self._lock = threading.Lock()
        self._mapped: dict[bytes, list[int]] = {}  # handle -> [base, opens]

    def _call(self, what: str, fn: Any, *args: Any) -> None:
        code = fn(*args)
        if code != 0:
            raise PeerMemoryError(f"{what} failed with driver status {code}")

    def export(self, address: int) -> Export:
        handle, base, size = _Handle(), ctypes.c_uint64(), ctypes.c_size_t()
        self._call("address range", self._range, ctypes.byref(base), ctypes.byref(size), address)
        self._call("IPC export", self._get, ctypes.byref(handle), base.value)
        return Export(bytes(handle.reserved), address - base.value)

    def open(self, handle: bytes) -> int:
        if len(handle) != HANDLE_BYTES:
            raise PeerMemoryError(f"an IPC handle has {HANDLE_BYTES} bytes, not {len(handle)}")
        with self._lock:
            mapped = self._mapped.get(handle)
            if mapped is None:
                base = ctypes.c_uint64()
                raw = _Handle()
                ctypes.memmove(ctypes.addressof(raw), handle, HANDLE_BYTES)
                self._call("IPC map", self._open, ctypes.byref(base), raw, LAZY_ENABLE_PEER_ACCESS)
                mapped = self._mapped[handle] = [base.value, 0]
            mapped[1] += 1
            return mapped[0]

    def close(self, handle: bytes) -> None:
        with self._lock:
            mapped = self._mapped.get(handle)
            if mapped is None:
                return
            mapped[1] -= 1
            if mapped[1] == 0:
                del self._mapped[handle]
                self._call("IPC unmap", self._close, mapped[0])
