"""The container, the test kit and the simulation build the same worker object graph."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from pytest_mock import MockerFixture

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.bootstrap import HandshakeTiming, WorkerIdentity, WorkerPorts, bootstrap
from moriio.config.settings import ConnectorSettings
from moriio.container import WorkerRuntime, build_worker
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.testing.inmemory import (
    FakeClock,
    InMemoryControlChannel,
    InMemoryFabric,
    InMemoryNetwork,
    InMemoryTransferEngine,
)
from moriio.testing.inmemory.wiring import InMemoryAdapters
from moriio.testing.stacks import Endpoint, KVMemory, Timing, build_stack
from moriio.testing.stacks.stack import HOST, fingerprint

PORTS = Endpoint(handshake_port=9000, notify_port=9100)


def _domain_graph(root: object) -> set[tuple[str, str]]:
    """(attribute path, class) of every moriio domain object reachable from ``root``.

    Ports (engines, channels, clocks) are where the three builders differ on purpose; the
    graph stops at them.
    """
    seen: set[int] = set()
    found: set[tuple[str, str]] = set()

    def fields(obj: object) -> Iterator[tuple[str, object]]:
        names = list(getattr(obj, "__dict__", {}))
        for cls in type(obj).__mro__:
            names += [n for n in getattr(cls, "__slots__", ()) if n != "__weakref__"]
        for name in names:
            if hasattr(obj, name):
                yield name, getattr(obj, name)

    def walk(path: str, obj: object) -> None:
        if id(obj) in seen or not type(obj).__module__.startswith("moriio.domain"):
            return
        seen.add(id(obj))
        found.add((path, type(obj).__qualname__))
        for name, value in fields(obj):
            walk(f"{path}.{name}", value)

    walk("service", root)
    return found


def _identity(mode: TransferMode, memory: KVMemory, producer: bool) -> WorkerIdentity:
    return WorkerIdentity(
        engine_name="w0",
        host=HOST,
        bind_host=HOST,
        handshake_port=PORTS.handshake_port,
        notify_port=PORTS.notify_port,
        tp_rank=0,
        tp_size=1,
        dp_rank=0,
        is_producer=producer,
        is_consumer=not producer,
        fingerprint=fingerprint(mode, memory),
        instance_id="w0",
    )


def _production(mode: TransferMode, producer: bool, memory: KVMemory) -> WorkerRuntime:
    clock = FakeClock()
    settings = ConnectorSettings(mode=mode)
    identity = _identity(mode, memory, producer)
    adapters = InMemoryAdapters(
        settings=settings,
        identity=identity,
        secret=None,
        fabric=InMemoryFabric(),
        network=InMemoryNetwork(clock),
        clock=clock,
    )
    return build_worker(settings, identity, memory.tensors(), adapters=adapters)


@pytest.mark.parametrize("mode", list(TransferMode))
@pytest.mark.parametrize("producer", [True, False], ids=["producer", "consumer"])
def test_the_simulation_builds_the_production_object_graph(
    mode: TransferMode, producer: bool
) -> None:
    memory = KVMemory(num_layers=2, num_blocks=4, block_size=4)
    runtime = _production(mode, producer, memory)
    clock = FakeClock()
    stack = build_stack(
        name="w0",
        mode=mode,
        is_producer=producer,
        endpoint=PORTS,
        memory=memory,
        clock=clock,
        fabric=InMemoryFabric(),
        network=InMemoryNetwork(clock),
        timing=Timing(),
        rng=random.Random(1),
        engine_plan=EngineFaultPlan(),
        channel_plan=ChannelFaultPlan(),
    )
    try:
        production = _domain_graph(runtime.service)
        simulated = _domain_graph(stack.service)
        assert production == simulated
        role = "producer" if producer else "consumer"
        assert ("service." + role, type(getattr(stack.service, role)).__qualname__) in production
        assert len(production) > 10  # the walk reached the books, ledgers and peers
    finally:
        runtime.shutdown()
        stack.crash()


def test_a_failed_bootstrap_gives_the_registered_kv_back(mocker: MockerFixture) -> None:
    clock = FakeClock()
    memory = KVMemory(num_layers=2, num_blocks=4, block_size=4)
    fabric, network = InMemoryFabric(), InMemoryNetwork(clock)
    engine = InMemoryTransferEngine("w0", fabric)
    notify = InMemoryControlChannel(network, WIRE_CODEC, HOST, PORTS.notify_port)
    ports = WorkerPorts(engine, notify, notify, clock, background_handshakes=False)
    identity = _identity(TransferMode.READ, memory, producer=True)
    registering = mocker.spy(engine, "register_region")
    giving_back = mocker.spy(engine, "deregister_region")
    with pytest.raises(ValueError, match="retry_after"):
        bootstrap(
            ports,
            identity,
            memory.tensors(),
            mode=TransferMode.READ,
            policy=TransferPolicy(transfer_timeout=1.0, defer_timeout=2.0),
            handshakes=HandshakeTiming(timeout=1.0, retry_after=5.0, max_retry_after=1.0),
        )
    # Every layer, and the buffer they lie in (a span): each given back.
    assert registering.call_count == len(memory.tensors()) + 1
    assert sorted(c.args[0].region_id for c in giving_back.call_args_list) == [
        r.region_id for r in registering.spy_return_list
    ]
    notify.close()
    engine.close()
