"""Fixtures shared by every tier."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from support.mori_stand_in import mori_stand_in as stand_in


@pytest.fixture
def mori_stand_in() -> Iterator[ModuleType]:
    """Make ``import mori`` load the stand-in for one test; returns ``mori.stand_in``."""
    with stand_in() as module:
        yield module
