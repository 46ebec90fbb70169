"""Hold the interpreter lock the way a pybind call without ``gil_scoped_release`` does."""

from __future__ import annotations

import ctypes
import threading

from mori import stand_in

_LIBC = ctypes.PyDLL(None)  # PyDLL calls keep the GIL (CDLL calls would release it)


def hold_gil(seconds: float) -> None:
    """Block the calling thread for ``seconds`` without releasing the GIL: every other
    Python thread of the process stops meanwhile, as during mori's ``CreateSession``."""
    if seconds > 0:
        _LIBC.usleep(ctypes.c_uint(int(seconds * 1e6)))


def setup_call(name: str) -> None:
    """A set-up binding without ``gil_scoped_release``: record who called it, then hold the
    interpreter lock for ``stand_in.SETUP_GIL_SECONDS``."""
    stand_in.SETUP_CALLS.append((name, threading.current_thread().name))
    hold_gil(stand_in.SETUP_GIL_SECONDS)
