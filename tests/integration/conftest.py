"""Fixtures of the P/D integration modules: the world a test's engines meet in, and a
builder of P/D pairs in it.

A module picks its world by naming the class in ``WORLD`` (default: the in-memory fakes;
``WORLD = NixlWorld`` for real NIXL agents and ZMQ sockets on 127.0.0.1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from support.pd.sim_proxy import PDProxy
    from support.pd.worlds import World


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """A fresh world of the module's ``WORLD`` class, closed after the test."""
    from support.pd.worlds import InMemoryWorld  # imported here: modules without vLLM skip

    kind: Callable[[], World] = getattr(request.module, "WORLD", InMemoryWorld)
    world = kind()
    yield world
    world.close()


@pytest.fixture
def make_pd(world: World) -> Iterator[Callable[..., PDProxy]]:
    """``make(read_mode, **kwargs)``: a P/D pair in the test's world; every pair built is
    closed after the world (a NIXL pump stops before its agents close)."""
    from support.pd.sim_proxy import build_pd

    built: list[PDProxy] = []

    def make(read_mode: bool, **kwargs: object) -> PDProxy:
        proxy = build_pd(world, read_mode, **kwargs)
        built.append(proxy)
        return proxy

    yield make
    world.close()
    for proxy in built:
        proxy.close()
