"""``moriio doctor --peer`` against a live peer: handshake, fingerprint diff, one-block READ.

The peer runs in this process as the connector's worker would: a NIXL engine with one
registered separated K/V layer, a :class:`PeerDirectory` answering handshakes on a ZMQ
control channel, and a thread driving the engine's progress. The doctor runs as the real
command in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from moriio.domain.kv.layout import LayerSpec
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.messages import Message
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.kv_registry import LayerTensor, LocalKV
from moriio.domain.worker.peers import PeerDirectory

pytestmark = pytest.mark.integration
pytest.importorskip("nixl_cu12", reason="NIXL is not installed")

SHAPE = (2, 4, 16, 2, 8)  # separated K/V, uint8: one K block is 16 * 2 * 8 = 256 bytes
BLOCK_LEN = 256
MODEL = "tiny-llama"


@dataclass
class LivePeer:
    port: int
    buffer: np.ndarray


@pytest.fixture
def live_peer() -> Iterator[LivePeer]:
    from moriio.adapters.clock import SystemClock
    from moriio.adapters.nixl import NixlTransferEngine
    from moriio.adapters.zmq import ZmqControlChannel

    buffer = (np.arange(int(np.prod(SHAPE))) % 251).astype(np.uint8)
    strides = tuple(s // buffer.itemsize for s in buffer.reshape(SHAPE).strides)
    engine = NixlTransferEngine("doctor-test-peer", loopback=True)
    kv = LocalKV.register(
        engine,
        [
            LayerTensor(
                name="model.layers.0.attn",
                addr=buffer.ctypes.data,
                shape=SHAPE,
                strides=strides,
                itemsize=1,
                dtype="uint8",
                spec=LayerSpec(16, 2, 8),
            )
        ],
    )
    channel: ZmqControlChannel[Message] = ZmqControlChannel(
        WIRE_CODEC, "127.0.0.1", 0, max_frame_bytes=8 << 20
    )
    fingerprint = Fingerprint(
        model_name=MODEL,
        dtype="uint8",
        block_size=16,
        layout_kinds=kv.layout_kinds,
        tp_size=1,
        transfer_mode=TransferMode.READ,
        total_num_kv_heads=2,
        is_mla=False,
    )
    peers = PeerDirectory(
        engine=engine,
        channel=channel,
        local=kv,
        fingerprint=fingerprint,
        control=channel.address,
        dp_rank=0,
        tp_rank=0,
        instance_id="live-peer-1",
        clock=SystemClock(),
        handshake_timeout=5.0,
    )
    channel.serve(peers.respond)
    stop = threading.Event()

    def pump() -> None:  # a transfer target must drive NIXL progress
        while not stop.wait(0.001):
            engine.progress()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield LivePeer(channel.address.port, buffer)
    finally:
        stop.set()
        thread.join(timeout=5)
        channel.close()
        kv.deregister(engine)
        engine.close()


def _doctor(port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [
        sys.executable,
        "-m",
        "moriio.cli.main",
        "doctor",
        "--ports",
        "",
        "--peer",
        f"127.0.0.1:{port}",
        "--dtype",
        "uint8",
        "--num-kv-heads",
        "2",
        "--timeout",
        "5",
        *extra,
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def test_doctor_handshakes_and_reads_one_block_from_a_live_peer(live_peer: LivePeer) -> None:
    done = _doctor(live_peer.port, "--model", MODEL, "--json")

    report = json.loads(done.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses[f"handshake 127.0.0.1:{live_peer.port}"] == "PASS", done.stdout
    assert statuses["round trip"] == "PASS", done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["ok"] is True
    peer = report["peer"]
    assert peer["fingerprint"]["model_name"] == MODEL
    assert peer["fingerprint"]["layout_kinds"] == ["separated"]
    assert peer["layers"] == 1
    expected = live_peer.buffer[:BLOCK_LEN].tobytes()
    assert peer["round_trip"]["bytes"] == BLOCK_LEN
    assert peer["round_trip"]["crc32"] == f"{zlib.crc32(expected):08x}"


def test_doctor_prints_the_fingerprint_diff_and_fails_on_a_mismatch(live_peer: LivePeer) -> None:
    done = _doctor(live_peer.port, "--model", "other-model", "--block-size", "32")

    assert done.returncode != 0
    lines = done.stdout.splitlines()
    handshake = next(line for line in lines if "handshake 127.0.0.1" in line)
    assert handshake.startswith("FAIL")
    # The peer names the fields that differ, never its values (nothing to replay).
    assert "incompatible peer: model_name differs; block_size differs" in done.stdout
    assert "tiny-llama" not in done.stdout
    assert "round trip" not in done.stdout
    assert lines[-1].startswith("result: ")
    assert "0 FAIL" not in lines[-1]
