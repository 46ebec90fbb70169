"""Hostile input at the public boundaries: the real vLLM scheduler with the connector, real
workers over ZMQ + NIXL on 127.0.0.1.

Each case sends one hostile request or frame, then checks that no exception escaped the
connector (every step runs its methods), that the listeners still answer a handshake, that no
held block was freed early, and that a following normal transfer moves the right bytes.
Cases covered elsewhere at this level: 5 (socket LRU: ``test_zmq_hardening``), 7 (``"*"``
trust: ``test_zmq_hardening``), 9 (handshake privacy: ``test_handshake_privacy``), 10
(cross-key start-up checks: ``test_params_validation``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import msgpack
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
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import (
    HandshakeRejected,
    HandshakeRequest,
    Message,
    Release,
    RemoteBlocks,
    WriteDone,
    WriteFailed,
)
from moriio.domain.values.modes import TransferMode
from moriio.ports import PeerAddress
from support.hostile import nixl_pd, send_raw
from support.pd.routing import HOST, new_transfer_id, prefill_params
from support.pd.sim_proxy import PDProxy
from support.pd.worlds import free_tcp_port

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(300)]

PROMPT = list(range(1, 70))  # four full blocks and one partial
FORGED = "f" * 32


@pytest.fixture(scope="module")
def attacker() -> Iterator[ZmqControlChannel[Message]]:
    channel: ZmqControlChannel[Message] = ZmqControlChannel(WIRE_CODEC, HOST, 0)
    yield channel
    channel.close()


PD_EXTRA = {"handshake_timeout": 1.0}


@pytest.fixture(scope="module")
def read_pd() -> Iterator[PDProxy]:
    yield from nixl_pd(True, num_blocks=512, extra=PD_EXTRA)


@pytest.fixture(scope="module")
def write_pd() -> Iterator[PDProxy]:
    yield from nixl_pd(False, num_blocks=512, extra=PD_EXTRA)


def _steps(proxy: PDProxy, count: int = 20) -> None:
    """Step both engines (every connector method runs): an escaping exception fails here."""
    for _ in range(count):
        proxy.step()


def _handshake_answered(attacker: ZmqControlChannel[Message], proxy: PDProxy) -> None:
    """Each engine's listener answers a handshake, naming fields, never its values."""
    fp = Fingerprint("not-this-model", "int8", 16, ("separated",), 1, TransferMode.READ, 1, False)
    request = HandshakeRequest(
        fp, b"meta", (LayerRegions("l0", (b"d",), 4, 64),), attacker.address, 0, 0, "x"
    )
    for address in (proxy.prefill_address, proxy.decode_address):
        reply = attacker.request(PeerAddress(HOST, address.handshake_port), request, timeout=10.0)
        assert isinstance(reply, HandshakeRejected)
        assert "model_name differs" in reply.reason
        assert "tiny" not in reply.reason  # the engine's own model name is not handed out


def _normal_transfer_moves_the_right_bytes(proxy: PDProxy, key: str) -> None:
    before = proxy.decode.stats.verified_blocks
    proxy.submit(key, PROMPT, 2)
    proxy.run(max_steps=3000, pause=0.001)
    assert proxy.done[key].finish_reason == FinishReason.LENGTH
    assert proxy.decode.stats.verified_blocks > before
    assert proxy.decode.stats.mismatched_blocks == 0
    assert proxy.leftovers() == []


def _after(attacker: ZmqControlChannel[Message], proxy: PDProxy, key: str) -> None:
    _handshake_answered(attacker, proxy)
    _normal_transfer_moves_the_right_bytes(proxy, key)


# -- kv_transfer_params -------------------------------------------------------------------


def _decode_params(proxy: PDProxy, **overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": new_transfer_id(),
        "remote_block_ids": [[1, 2, 3]],
        "remote_host": HOST,
        "remote_handshake_port": proxy.prefill_address.handshake_port,
        "remote_notify_port": proxy.prefill_address.notify_port,
        "remote_tp_size": 1,
    }
    return {**params, **overrides}


HOSTILE_PARAMS: dict[str, dict[str, Any]] = {
    "1-host-trailing-space": {"remote_host": "127.0.0.1 "},
    "2-engine-id-dict": {"remote_engine_id": {}},
    "2-engine-id-list": {"remote_engine_id": [1]},
    "3-dp-rank-huge": {"remote_dp_rank": 10**6},
    "3-host-newline": {"remote_host": "127.0.0.1\n"},
    "4-tp-size-huge": {"remote_tp_size": 10**9},
    "minor-fullwidth-port": {"remote_notify_port": "\uff16\uff13\uff10\uff11"},
    "minor-bool-block-id": {"remote_block_ids": [[True]]},
    "minor-lease-inf": {"lease_expires_at": float("inf")},
    "minor-long-transfer-id": {"transfer_id": "x" * 100_000},
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PARAMS))
def test_hostile_params_run_locally_and_harm_nothing(
    read_pd: PDProxy, attacker: ZmqControlChannel[Message], case: str
) -> None:
    overrides = HOSTILE_PARAMS[case]
    side = read_pd.decode.connector.scheduler_side
    assert side is not None
    rejected = side.rejected_params
    read_pd.decode.add(f"hostile-{case}", PROMPT, 2, _decode_params(read_pd, **overrides))
    _steps(read_pd)
    assert read_pd.done[f"hostile-{case}"].finish_reason == FinishReason.LENGTH  # ran locally
    assert side.rejected_params == rejected + 1
    _after(attacker, read_pd, f"after-{case}")


def test_6_a_dead_peer_fails_its_own_request_only(
    read_pd: PDProxy, attacker: ZmqControlChannel[Message]
) -> None:
    dead = free_tcp_port()
    params = _decode_params(read_pd, remote_handshake_port=dead, remote_notify_port=dead)
    params = signed_params(params, secrets.token_bytes(32), "dead#0")  # it waits to verify
    fresh = list(range(500, 569))  # no local prefix-cache hit: the load must go remote
    read_pd.decode.add("hostile-dead-peer", fresh, 2, params)
    _normal_transfer_moves_the_right_bytes(read_pd, "beside-dead-peer")
    assert read_pd.done["hostile-dead-peer"].finish_reason == FinishReason.ERROR
    finished = list(read_pd.done)  # in the order they finished
    assert finished.index("beside-dead-peer") < finished.index("hostile-dead-peer")
    _after(attacker, read_pd, "after-dead-peer")


# -- frames -------------------------------------------------------------------------------


def _hold(proxy: PDProxy, key: str) -> tuple[str, dict[str, Any]]:
    """Prefill ``key`` and keep its blocks held (the decode request is not sent yet)."""
    tid = new_transfer_id()
    p_id = f"p-{key}"
    proxy.prefill.add(p_id, PROMPT, 1, prefill_params(tid))
    for _ in range(50):
        for output in proxy.prefill.step():
            if output.request_id == p_id:
                assert output.kv_transfer_params
                return p_id, dict(output.kv_transfer_params)
    raise AssertionError(f"{p_id} never finished its prefill")


def _remote_blocks_body(tid: str, reply_host: str, token: str) -> dict[str, Any]:
    body = dict(
        WIRE_CODEC.encode(
            RemoteBlocks(tid, "r", (1, 2), 0, 0, 0, 1, PeerAddress(HOST, 9), "i", 4e9, token)
        )
    )
    body["reply_host"] = reply_host
    return body


@pytest.mark.parametrize("forgery", ["no-token", "wrong-token", "replayed-twice", "rank-spoof"])
def test_8_forged_releases_free_nothing(
    read_pd: PDProxy, attacker: ZmqControlChannel[Message], forgery: str
) -> None:
    p_id, returned = _hold(read_pd, f"held-{forgery}")
    tid = returned["transfer_id"]
    notify = PeerAddress(HOST, read_pd.prefill_address.notify_port)
    _steps(read_pd, 2)  # the worker applies the hold
    forged = {
        "no-token": [Release(tid)],
        "wrong-token": [Release(tid, 1, 0, FORGED)],
        "replayed-twice": [Release(tid, 1, 0, FORGED)] * 2,
        "rank-spoof": [Release(tid, 2, 0, FORGED), Release(tid, 2, 1, FORGED)],
    }[forgery]
    for message in forged:
        attacker.send(notify, message)
    # Case 1 on the wire: a remote_blocks whose reply host has a trailing space.
    send_raw(notify, _remote_blocks_body(tid, "127.0.0.1 ", FORGED))
    send_raw(notify, {**WIRE_CODEC.encode(Release(tid)), "junk": msgpack.packb(1)})
    _steps(read_pd, 30)
    assert read_pd.prefill.finished_sending[p_id] == 0  # still held
    refused = read_pd.prefill.service.ctx.counters.releases_refused
    assert refused >= len(forged)
    # The genuine consumer reads the held blocks: the right bytes, then they are freed.
    key = f"held-{forgery}"
    read_pd.decode_ids[key] = f"d-{key}"
    read_pd._key_of[f"d-{key}"] = key
    read_pd.transfer_ids[key] = tid
    before = read_pd.decode.stats.verified_blocks
    read_pd.decode.add(f"d-{key}", PROMPT, 2, returned)
    read_pd.run(max_steps=3000, pause=0.001)
    assert read_pd.done[key].finish_reason == FinishReason.LENGTH
    assert read_pd.decode.stats.verified_blocks > before
    assert read_pd.decode.stats.mismatched_blocks == 0
    assert read_pd.prefill.finished_sending[p_id] == 1
    _after(attacker, read_pd, f"after-{forgery}")


@pytest.mark.parametrize(
    "forgery", ["write-done-no-token", "write-done-wrong-token", "write-failed", "remote-blocks"]
)
def test_write_forgeries_neither_complete_nor_redirect_a_push(
    write_pd: PDProxy, attacker: ZmqControlChannel[Message], forgery: str
) -> None:
    key = f"w-{forgery}"
    tid = write_pd.submit(key, PROMPT, 2, to_prefill=False)
    write_pd.step_decode()  # the decode announces its blocks and waits for the push
    d_id = write_pd.decode_ids[key]
    d_notify = PeerAddress(HOST, write_pd.decode_address.notify_port)
    p_notify = PeerAddress(HOST, write_pd.prefill_address.notify_port)
    if forgery == "write-done-no-token":
        attacker.send(d_notify, WriteDone(tid))
    elif forgery == "write-done-wrong-token":
        attacker.send(d_notify, WriteDone(tid, FORGED))
    elif forgery == "write-failed":
        attacker.send(d_notify, WriteFailed(tid, "forged", FORGED))
    else:  # another announcement for the same transfer, pointing at other blocks
        send_raw(p_notify, _remote_blocks_body(tid, HOST, FORGED))
    _steps(write_pd, 20)
    assert write_pd.decode.finished_recving[d_id] == 0  # still fenced, no verdict taken
    assert key not in write_pd.done
    # The prefill runs now: the genuine push completes with the right bytes.
    p_id = write_pd.prefill_ids[key]
    write_pd.prefill.add(p_id, PROMPT, 1, prefill_params(tid, write_pd.decode_address))
    write_pd.pending[p_id] = (key, PROMPT, 2)
    before = write_pd.decode.stats.verified_blocks
    write_pd.run(max_steps=3000, pause=0.001)
    assert write_pd.done[key].finish_reason == FinishReason.LENGTH
    assert write_pd.decode.stats.verified_blocks > before
    assert write_pd.decode.stats.mismatched_blocks == 0
    counters = (write_pd.decode.service.ctx.counters, write_pd.prefill.service.ctx.counters)
    assert sum(c.verdicts_refused + c.announcements_refused for c in counters) >= 1
    _after(attacker, write_pd, f"after-{forgery}")
