"""A compare-and-swap on a 32-bit word of host memory, from the C runtime's ``libatomic``.

A layer gate's flag is written by the device (a closing, in stream order) and by the host
(an opening): the host must not read the flag and then write it, since a closing landing in
between would be undone. ``__atomic_compare_exchange_4`` is a locked instruction on the
word's cache line, which the device's bus writes to pinned memory respect.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

SEQ_CST = 5  # __ATOMIC_SEQ_CST
_MASK = 0xFFFFFFFF


class HostAtomics:
    """``compare_exchange(address, expected, desired)``: the word's value before the call;
    it was replaced by ``desired`` exactly when that value equals ``expected``."""

    def __init__(self, library: str | None = None) -> None:
        name = library or ctypes.util.find_library("atomic") or "libatomic.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            raise OSError(f"no host compare-and-swap ({name}): {exc}") from exc
        self._cas: Any = getattr(lib, "__atomic_compare_exchange_4")
        self._cas.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_int,
        ]
        self._cas.restype = ctypes.c_bool

    def compare_exchange(self, address: int, expected: int, desired: int) -> int:
        seen = ctypes.c_uint32(expected & _MASK)
        self._cas(address, ctypes.byref(seen), desired & _MASK, SEQ_CST, SEQ_CST)
        return int(seen.value)
