"""A device-memory transfer UCX refuses because emulation is forbidden: named, not a lost peer.

With ``UCX_PROTO_EMULATION_ENABLE=n`` and no zero-copy protocol for device memory, NIXL
refuses the post with ``NIXL_ERR_REMOTE_DISCONNECT`` (measured on an H200). The adapter names
the likely cause, and the worker treats it as an ordinary failed transfer. NIXL is faked: an
agent whose every post is refused that way.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from pytest_mock import MockerFixture

from moriio.adapters.nixl import engine as engine_module
from moriio.adapters.nixl._loader import NixlApi
from moriio.adapters.nixl.engine import NixlTransferEngine
from moriio.adapters.nixl.failures import EMULATION_FORBIDDEN, explain
from moriio.domain.worker.poster import PostResult
from moriio.ports import Allocation, LocalRegion, MemoryKind, TransferOp, TransferState
from moriio.testing.stacks.stack import Timing
from support.quarantine import LOCAL, read_world

DISCONNECT = "nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT"


class nixlRemoteDisconnectError(Exception):  # noqa: N801  # NIXL's name, as its bindings spell it
    pass


class FakeAgent:
    """The NIXL agent calls the adapter makes; every post is refused as a remote disconnect."""

    def __init__(self, name: str, config: object) -> None:
        self.name, self.backends = name, {"UCX": object()}
        self.removed: list[str] = []
        self.posts = 0

    def get_agent_metadata(self) -> bytes:
        return self.name.encode()

    def register_memory(self, descs: list[Any], mem_type: str) -> tuple[Any, ...]:
        return (tuple(descs), mem_type)

    def get_partial_agent_metadata(self, reg: object, inc_conn_info: bool) -> bytes:
        return b""

    def deregister_memory(self, reg: object) -> None:
        pass

    def add_remote_agent(self, metadata: bytes) -> bytes:
        return metadata

    def remove_remote_agent(self, peer: str) -> None:
        self.removed.append(peer)

    def get_xfer_descs(self, descs: object, mem_type: str) -> object:
        return descs

    def initialize_xfer(self, *args: object) -> object:
        return object()

    def transfer(self, handle: object) -> str:
        self.posts += 1
        raise nixlRemoteDisconnectError("NIXL_ERR_REMOTE_DISCONNECT")

    def check_xfer_state(self, handle: object) -> str:
        raise nixlRemoteDisconnectError("NIXL_ERR_REMOTE_DISCONNECT")

    def release_xfer_handle(self, handle: object) -> None:
        pass

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        return {}


class DeviceNixl(NixlTransferEngine):
    """Registers every region as device memory (the workers' test KV lives in host arrays)."""

    def register_region(
        self,
        addr: int,
        length: int,
        kind: MemoryKind = MemoryKind.HOST,
        device_id: int = 0,
        allocation: Allocation | None = None,
    ) -> LocalRegion:
        return super().register_region(addr, length, MemoryKind.DEVICE, device_id, allocation)


@pytest.fixture(autouse=True)
def fake_nixl(mocker: MockerFixture) -> None:
    api = NixlApi("fake", FakeAgent, lambda **kw: kw, (nixlRemoteDisconnectError,))
    mocker.patch.object(engine_module, "load_nixl", return_value=api)
    mocker.patch.dict(os.environ)
    os.environ.pop("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", None)
    os.environ["UCX_PROTO_EMULATION_ENABLE"] = "n"


def _post_once(kind: MemoryKind) -> tuple[NixlTransferEngine, FakeAgent, TransferState, str]:
    consumer, producer = NixlTransferEngine("consumer"), NixlTransferEngine("producer")
    buf = np.zeros(8192, np.uint8)
    local = consumer.register_region(buf.ctypes.data, 4096, kind)
    theirs = producer.register_region(buf.ctypes.data + 4096, 4096, kind)
    remote = consumer.import_region(consumer.add_peer(producer.metadata()), theirs.descriptor)
    offsets = np.zeros(1, np.int64)
    sizes = np.full(1, 4096, np.int64)
    handle = consumer.post(TransferOp.READ, local, remote, offsets, offsets, sizes, "tx/l0")
    status = consumer.poll(handle)
    assert consumer.settled(handle)  # ended: no byte of it can land any more
    return consumer, consumer._agent, status.state, status.message


def test_a_refused_device_read_names_the_cause_and_keeps_the_peer() -> None:
    engine, agent, state, message = _post_once(MemoryKind.DEVICE)
    assert state is TransferState.FAILED
    assert message.startswith(f"{EMULATION_FORBIDDEN}: UCX found no zero-copy protocol")
    assert "UCX_PROTO_EMULATION_ENABLE=n forbids the software fallback" in message
    assert "set UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in message
    assert DISCONNECT in message  # NIXL's own words stay in the message
    assert agent.removed == []
    assert engine._peers == {"producer"}


@pytest.mark.parametrize(
    ("kind", "emulation"),
    [(MemoryKind.HOST, "n"), (MemoryKind.DEVICE, "y"), (MemoryKind.DEVICE, None)],
)
def test_other_remote_disconnects_keep_nixls_words(kind: MemoryKind, emulation: str | None) -> None:
    """Host memory never takes cuda_ipc, and with emulation allowed a disconnect is one."""
    if emulation is None:
        os.environ.pop("UCX_PROTO_EMULATION_ENABLE")
    else:
        os.environ["UCX_PROTO_EMULATION_ENABLE"] = emulation
    _, _, state, message = _post_once(kind)
    assert state is TransferState.FAILED
    assert message == f"NIXL posting failed: {DISCONNECT}"


@pytest.mark.parametrize("value", ["n", "no", "0", "off", "OFF"])
def test_every_spelling_of_off_forbids_emulation(value: str) -> None:
    env = {"UCX_PROTO_EMULATION_ENABLE": value}
    explained = explain(f"NIXL polling failed: {DISCONNECT}", True, env)
    assert explained is not None
    assert f"UCX_PROTO_EMULATION_ENABLE={value} forbids" in explained
    assert explain("NIXL polling failed: nixlBackendError: NIXL_ERR_BACKEND", True, env) is None


def test_with_get_zero_copy_already_on_the_message_points_elsewhere() -> None:
    env = {"UCX_PROTO_EMULATION_ENABLE": "n", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
    explained = explain(DISCONNECT, True, env)
    assert explained is not None
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y is set" in explained
    assert "UCX_TLS" in explained
    assert "expandable_segments" in explained


def test_the_worker_fails_the_read_as_an_ordinary_failure_not_a_lost_peer() -> None:
    world = read_world(DeviceNixl, Timing(liveness_timeout=60.0))
    results: list[PostResult] = []
    world.consumer.service.ctx.poster.observe(results.extend)
    world.start_read()
    report = world.step()
    for _ in range(3):
        if report.failed_recving:
            break
        report = world.step(0.001)
    assert report.failed_recving == {"d-1"}
    assert report.invalid_block_ids == set(LOCAL)
    assert results
    assert all(r.message.startswith(EMULATION_FORBIDDEN) for r in results)
    stats = world.stats
    assert dict(stats.failures_by_kind) == {"read": 1}  # not "lost"
    assert stats.peer_teardowns == 0
    assert world.quarantined_batches == 0  # settled: nothing kept in case bytes still land
    agent = world.consumer.inner_engine._agent  # type: ignore[attr-defined]
    assert agent.posts >= 1
    assert agent.removed == []


def test_a_peer_that_dies_after_device_reads_worked_is_a_disconnect_not_emulation(
    mocker: MockerFixture,
) -> None:
    """Emulation forbidden, but device READs to this peer have worked: UCX has a protocol
    for them, so the disconnect is the peer's (NIXL's own words, no emulation advice)."""

    class DiesLater(FakeAgent):
        def transfer(self, handle: object) -> str:
            self.posts += 1
            if self.posts == 1:
                return "DONE"
            raise nixlRemoteDisconnectError("NIXL_ERR_REMOTE_DISCONNECT")

    api = NixlApi("fake", DiesLater, lambda **kw: kw, (nixlRemoteDisconnectError,))
    mocker.patch.object(engine_module, "load_nixl", return_value=api)
    consumer, producer = NixlTransferEngine("consumer"), NixlTransferEngine("producer")
    buf = np.zeros(8192, np.uint8)
    local = consumer.register_region(buf.ctypes.data, 4096, MemoryKind.DEVICE)
    theirs = producer.register_region(buf.ctypes.data + 4096, 4096, MemoryKind.DEVICE)
    remote = consumer.import_region(consumer.add_peer(producer.metadata()), theirs.descriptor)
    offsets, sizes = np.zeros(1, np.int64), np.full(1, 4096, np.int64)
    states = []
    for _ in range(2):
        handle = consumer.post(TransferOp.READ, local, remote, offsets, offsets, sizes, "tx/l0")
        states.append(consumer.poll(handle))
    assert states[0].state is TransferState.SUCCEEDED
    assert states[1].state is TransferState.FAILED
    assert states[1].message == f"NIXL posting failed: {DISCONNECT}"
