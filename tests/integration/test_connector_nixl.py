"""Real vLLM schedulers for P and D with our connector over NIXL (UCX) and ZMQ on 127.0.0.1.

Both NIXL agents live in this process (supported); the workers build their adapters with the
connector's own container (``NixlAdapters``), on free ports.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import pytest

pytest.importorskip("vllm")

from moriio.adapters.nixl._loader import load_nixl
from moriio.testing.handoffs import signed_params

try:
    load_nixl(loopback=True)
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"NIXL is not installed: {exc}", allow_module_level=True)

from vllm.v1.engine import FinishReason

from moriio.adapters.zmq import ZmqControlChannel
from moriio.ports import PeerAddress
from support.pd.sim_proxy import PDProxy, drive, random_workload
from support.pd.worlds import NixlWorld

WORLD = NixlWorld  # the conftest's world: real NIXL agents and ZMQ sockets

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(120)]

MODES = pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
NUM_REQUESTS = 500  # per mode: about 3 s each over NIXL's CMA/TCP loopback


def test_workers_use_nixl_and_zmq(make_pd: Callable[..., PDProxy]) -> None:
    proxy = make_pd(True, num_blocks=64)
    for engine in (proxy.prefill, proxy.decode):
        ctx = engine.service.ctx
        assert isinstance(ctx.channel, ZmqControlChannel)
        assert ctx.control.host == "127.0.0.1"
        assert engine.adapters is None  # the connector's own NixlAdapters


@MODES
def test_many_requests_over_nixl_move_identical_kv_and_free_every_block(
    world: NixlWorld, make_pd: Callable[..., PDProxy], read_mode: bool
) -> None:
    proxy = make_pd(read_mode, num_blocks=4096)
    workload = random_workload(seed=21 if read_mode else 22, count=NUM_REQUESTS)
    drive(proxy, workload, concurrency=64)
    assert len(proxy.done) == NUM_REQUESTS
    assert {o.finish_reason for o in proxy.done.values()} == {FinishReason.LENGTH}
    assert proxy.decode.stats.verified_blocks > 0
    assert proxy.decode.stats.mismatched_blocks == 0
    assert not proxy.decode.stats.load_errors
    mover = proxy.decode if read_mode else proxy.prefill
    stats = mover.transfer_stats()
    assert stats["bytes"] > 0
    assert stats["failed"] == 0
    assert stats["handshakes"] == 1
    assert proxy.leftovers() == []
    assert world.pump_errors == []


@MODES
def test_router_style_request_ids_over_nixl(
    world: NixlWorld, make_pd: Callable[..., PDProxy], read_mode: bool
) -> None:
    proxy = make_pd(read_mode, num_blocks=1024, router_style=True)
    drive(proxy, random_workload(seed=23, count=60, max_len=200), concurrency=16)
    assert {o.finish_reason for o in proxy.done.values()} == {FinishReason.LENGTH}
    assert len(proxy.done) == 60
    assert proxy.decode.stats.verified_blocks > 0
    assert proxy.decode.stats.mismatched_blocks == 0
    assert proxy.leftovers() == []
    assert world.pump_errors == []


def test_untrusted_peer_is_refused_before_any_socket(make_pd: Callable[..., PDProxy]) -> None:
    """Params naming a host outside trusted_remote_hosts: no handshake, no release is sent;
    the request fails with a load error and the refusals are counted."""
    proxy = make_pd(True, num_blocks=64)
    decode = proxy.decode
    untrusted = "192.0.2.7"  # TEST-NET-1: never routed
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": "tx-untrusted",
        "remote_block_ids": [[3, 4, 5]],
        "remote_host": untrusted,
        "remote_handshake_port": 7001,
        "remote_notify_port": 7002,
        "remote_tp_size": 1,
    }
    params = signed_params(params, secrets.token_bytes(32), "untrusted#0")  # never verified
    decode.add("d-untrusted", list(range(1, 40)), 2, params)
    for _ in range(5):
        decode.step()
    assert decode.outputs["d-untrusted"].finish_reason == FinishReason.ERROR
    channel = decode.service.ctx.channel
    assert isinstance(channel, ZmqControlChannel)
    assert all(peer.host != untrusted for peer in channel.open_peers)
    assert untrusted not in channel.trusted_hosts
    stats = decode.transfer_stats()
    assert stats.get("messages_refused", 0) == 0  # nor a release: never verified
    assert stats["handshake_failures"] == 1
    assert stats["failed_handshake"] == 1
    assert decode.leftovers() == []
    assert PeerAddress(untrusted, 7002) not in channel.dropped_sends
