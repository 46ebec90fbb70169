"""Hold the interpreter lock the way a pybind call without ``gil_scoped_release`` does."""

from __future__ import annotations

import ctypes

_LIBC = ctypes.PyDLL(None)  # PyDLL calls keep the GIL (CDLL calls would release it)


def hold_gil(seconds: float) -> None:
    """Block the calling thread for ``seconds`` without releasing the GIL: every other
    Python thread of the process stops meanwhile, as during mori's ``CreateSession``."""
    if seconds > 0:
        _LIBC.usleep(ctypes.c_uint(int(seconds * 1e6)))
