"""What joins the engines of a P/D test: the in-memory fakes or real NIXL + ZMQ on 127.0.0.1."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from moriio.adapters.clock import SystemClock
from moriio.bootstrap import WorkerIdentity
from moriio.config.settings import ConnectorSettings
from moriio.domain.worker.service import WorkerService
from moriio.ports import Clock
from moriio.testing.inmemory import InMemoryFabric, InMemoryNetwork
from moriio.testing.inmemory.wiring import InMemoryAdapters
from moriio_tools.harness import free_ports
from support.pd.routing import HOST, Address

if TYPE_CHECKING:
    from support.pd.sim_engine import SimEngine

AdaptersFactory = Callable[[ConnectorSettings, WorkerIdentity, "bytes | None"], Any]


class World(Protocol):
    """What joins the engines of one test."""

    @property
    def adapters_factory(self) -> AdaptersFactory | None: ...

    def address(self) -> Address: ...

    def start(self, engines: Sequence[SimEngine]) -> None: ...

    def close(self) -> None: ...


class InMemoryWorld:
    """One fabric and network joining every engine of a test, plus their clock."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.fabric = InMemoryFabric()
        self.network = InMemoryNetwork(self.clock)
        self._ports = itertools.count(20_000, 10)

    @property
    def adapters_factory(self) -> AdaptersFactory:
        return self.adapters

    def adapters(
        self, settings: ConnectorSettings, identity: WorkerIdentity, secret: bytes | None
    ) -> InMemoryAdapters:
        return InMemoryAdapters(
            settings=settings,
            identity=identity,
            secret=secret,
            fabric=self.fabric,
            network=self.network,
            clock=self.clock,
        )

    def address(self) -> Address:
        base = next(self._ports)
        return Address(HOST, base, base + 1)

    def start(self, engines: Sequence[SimEngine]) -> None:
        """Nothing runs in the background in memory."""

    def close(self) -> None:
        """Nothing to release."""


def free_tcp_port() -> int:
    return free_ports(1, HOST)[0]


class NixlWorld:
    """Real NIXL agents (UCX, progress thread off) and real ZMQ channels on 127.0.0.1.

    The workers use the connector's own adapters (``NixlAdapters``). In production each engine
    runs in its own process and pumps its NIXL agent every step, so a transfer's target is
    progressed while the initiator waits. Here both engines share one thread and an engine
    blocked in ``wait_for_layer_load`` would starve the other's agent, so a pump thread stands
    in for the peer process: it drives every agent's progress each millisecond (the adapter
    serialises calls with its own lock).
    """

    adapters_factory: AdaptersFactory | None = None

    def __init__(self, pump_interval: float = 0.001) -> None:
        self._interval = pump_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pump_errors: list[BaseException] = []

    def address(self) -> Address:
        handshake, notify = free_ports(2, HOST)
        return Address(HOST, handshake, notify)

    def start(self, engines: Sequence[SimEngine]) -> None:
        services = [e.service for e in engines]
        self._thread = threading.Thread(
            target=self._pump, args=(services,), name="nixl-peer-pump", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the pump; raises if it failed (every test using the world checks it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.pump_errors:
            raise AssertionError(f"the NIXL pump failed: {self.pump_errors!r}") from (
                self.pump_errors[0]
            )

    def _pump(self, services: list[WorkerService]) -> None:
        while not self._stop.wait(self._interval):
            try:
                for service in services:
                    service.ctx.poster.progress_engine()
            except Exception as exc:  # recorded for the test to assert on
                self.pump_errors.append(exc)
                return
