"""Fixtures for the TransferEngine contract suite."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

STAND_INS = str(Path(__file__).resolve().parents[1] / "stand_ins")


def _mori_modules() -> dict[str, ModuleType]:
    return {n: m for n, m in sys.modules.items() if n == "mori" or n.startswith("mori.")}


@pytest.fixture
def mori_stand_in() -> Iterator[ModuleType]:
    """Make ``import mori`` load the stand-in for one test; returns ``mori.stand_in``."""
    saved = _mori_modules()
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, STAND_INS)
    try:
        yield importlib.import_module("mori.stand_in")
    finally:
        sys.path.remove(STAND_INS)
        for name in _mori_modules():
            del sys.modules[name]
        sys.modules.update(saved)
