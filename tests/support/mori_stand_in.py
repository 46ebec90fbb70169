"""``import mori`` that loads the stand-in module of ``tests/stand_ins`` (no mori here)."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

STAND_INS = str(Path(__file__).resolve().parents[1] / "stand_ins")


def _mori_modules() -> dict[str, ModuleType]:
    return {n: m for n, m in sys.modules.items() if n == "mori" or n.startswith("mori.")}


@contextlib.contextmanager
def mori_stand_in() -> Iterator[ModuleType]:
    """Make ``import mori`` load the stand-in while inside; yields ``mori.stand_in``."""
    saved = _mori_modules()
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, STAND_INS)
    module = None
    try:
        module = importlib.import_module("mori.stand_in")
        yield module
    finally:
        if module is not None:
            module.reset()  # stops the engines' completion threads
        sys.path.remove(STAND_INS)
        for name in _mori_modules():
            del sys.modules[name]
        sys.modules.update(saved)
