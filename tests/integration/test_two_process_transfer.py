"""Two OS processes on loopback: ZMQ handshake, then NIXL READ and WRITE of real KV geometry.

The peer process (``tests/support/transfer_peer.py``) and this test process each register
32 separated K/V bf16 layers ``[2, num_blocks, 16, 8, 128]`` (32 KiB per K or V block) with
a NIXL engine, serve handshakes with :class:`PeerDirectory` on a ZMQ control channel, and
move blocks through the planner, the plan cache and the :class:`Poster`, as the connector
does. Every byte of every layer is checked on the side that received data.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from moriio.domain.protocol.messages import RemoteBlocks, WriteDone, WriteFailed
from moriio.domain.values.capability import new_token
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.peer_checks import PeerUnavailableError
from moriio.domain.worker.poster import PostResult
from moriio.ports import TransferOp
from moriio.testing.handoffs import PROMPT
from support.transfer_peer import (
    BLOCK_BYTES,
    POLL_S,
    Bytes,
    KvSide,
    PeerProcess,
    block_view,
    digest,
    pattern,
)

pytestmark = pytest.mark.integration

NUM_LAYERS = 32
PRODUCER_BLOCKS = 16  # 32 layers x 2 x 16 x 32 KiB = 32 MiB in the peer process
CONSUMER_BLOCKS = 12  # a different cache size on each side, as in real deployments
PRODUCER_SEED = 1
CONSUMER_SEED = 2
# A killed peer is detected by the transport (the connection drops), not by a timeout: its
# READs fail in milliseconds. The bound leaves a loaded 2-core machine room and stays far
# below the 30 s transfer_timeout that a READ left waiting on a dead peer would run into.
DEAD_PEER_FAILS_WITHIN_S = 5.0

Spawn = Callable[..., PeerProcess]
OpenSide = Callable[..., KvSide]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start peer processes; every one still running at teardown is stopped."""
    started: list[PeerProcess] = []

    def start(*args: str) -> PeerProcess:
        peer = PeerProcess(*args)
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.stop()


@pytest.fixture
def open_side() -> Iterator[OpenSide]:
    """Open this process's KV sides; all are closed at teardown (before peers stop)."""
    sides: list[KvSide] = []

    def build(**kwargs: Any) -> KvSide:
        side = KvSide.open(**kwargs)
        sides.append(side)
        return side

    yield build
    for side in sides:
        side.close()


def start_producer(spawn: Spawn, mode: TransferMode, seed: int = PRODUCER_SEED) -> PeerProcess:
    return spawn(
        "--num-blocks",
        str(PRODUCER_BLOCKS),
        "--num-layers",
        str(NUM_LAYERS),
        "--seed",
        str(seed),
        "--mode",
        mode.value,
    )


def expected_layer(
    layer: int, local_ids: Sequence[int], remote_ids: Sequence[int], *, src_seed: int
) -> Bytes:
    """The consumer's layer after ``remote_ids`` of the producer landed in ``local_ids``."""
    want = pattern(CONSUMER_SEED, layer, CONSUMER_BLOCKS)
    src = block_view(pattern(src_seed, layer, PRODUCER_BLOCKS), PRODUCER_BLOCKS)
    block_view(want, CONSUMER_BLOCKS)[:, list(local_ids)] = src[:, list(remote_ids)]
    return want


def wrong_chunks(
    side: KvSide, local_ids: Sequence[int], remote_ids: Sequence[int], *, src_seed: int
) -> list[tuple[int, str, int]]:
    """(layer, "K" or "V", block) of every chunk whose bytes differ from the expectation."""
    wrong: list[tuple[int, str, int]] = []
    for layer, buffer in enumerate(side.buffers):
        want = block_view(
            expected_layer(layer, local_ids, remote_ids, src_seed=src_seed), CONSUMER_BLOCKS
        )
        got = block_view(buffer, CONSUMER_BLOCKS)
        bad = np.argwhere((got != want).any(axis=2))
        wrong.extend((layer, "KV"[int(half)], int(block)) for half, block in bad)
    return wrong


def failures(results: Sequence[PostResult]) -> list[str]:
    return [f"{r.request.layer}: {r.message}" for r in results if not r.ok]


@pytest.mark.timeout(60)
def test_read_pulls_permuted_blocks_into_the_right_places(
    spawn: Spawn, open_side: OpenSide
) -> None:
    producer = start_producer(spawn, TransferMode.READ)
    side = open_side(num_layers=NUM_LAYERS, num_blocks=CONSUMER_BLOCKS, seed=CONSUMER_SEED)
    # Runs stepping +1 and -1 on both sides (coalesced), and scattered blocks in between;
    # consumer blocks 2, 6 and 10 are not read into and must keep their bytes.
    local_ids = [3, 4, 5, 11, 0, 9, 8, 7, 1]
    remote_ids = [10, 11, 12, 2, 15, 6, 5, 4, 0]

    peer = side.peers.connect(producer.address)
    assert peer.fingerprint == side.fingerprint
    assert list(peer.layers) == list(side.kv.names)
    assert {(r.num_blocks, r.block_len) for r in peer.layers.values()} == {
        (PRODUCER_BLOCKS, BLOCK_BYTES)
    }

    requests, plans = side.posts("read-1", TransferOp.READ, producer.address, local_ids, remote_ids)
    assert (plans.computations, plans.hits) == (1, NUM_LAYERS - 1)
    plan = requests[0].plan
    assert all(r.plan is plan for r in requests)
    assert plan.num_descriptors == 2 * 5  # five runs, K and V
    assert plan.total_bytes == 2 * len(local_ids) * BLOCK_BYTES

    results = side.run(requests, timeout=20.0)
    assert len(results) == NUM_LAYERS
    assert failures(results) == []
    assert side.poster.stats.bytes_moved == NUM_LAYERS * plan.total_bytes
    assert wrong_chunks(side, local_ids, remote_ids, src_seed=PRODUCER_SEED) == []

    # A READ leaves the source untouched, and the peer saw nothing malformed.
    want = digest([pattern(PRODUCER_SEED, i, PRODUCER_BLOCKS) for i in range(NUM_LAYERS)])
    assert producer.command("digest", "digest")["sha256"] == want
    stats = producer.command("stats", "stats")
    assert stats["rejected_requests"] == 0
    assert stats["channel_rejected"] == {}
    side.close()
    assert producer.stop() == 0


@pytest.mark.timeout(60)
def test_write_pushes_blocks_and_write_done_follows_the_data(
    spawn: Spawn, open_side: OpenSide
) -> None:
    producer = start_producer(spawn, TransferMode.WRITE)
    side = open_side(
        num_layers=NUM_LAYERS,
        num_blocks=CONSUMER_BLOCKS,
        seed=CONSUMER_SEED,
        mode=TransferMode.WRITE,
    )
    # The producer's request holds 7 blocks; the consumer had the first 2 as local prefix
    # hits and announces destinations for the other 5.
    tid = "write-1"
    producer_blocks = [14, 13, 1, 2, 3, 9, 7]
    first_block = 2
    dest_ids = [6, 7, 8, 0, 11]
    producer.command("save", "saved", transfer_id=tid, block_ids=producer_blocks)

    token = new_token()
    side.channel.send(
        producer.address,
        RemoteBlocks(
            transfer_id=tid,
            request_id="req-1",
            block_ids=tuple(dest_ids),
            first_block=first_block,
            consumer_dp_rank=0,
            consumer_tp_rank=0,
            consumer_tp_size=1,
            reply_to=side.channel.address,
            consumer_instance_id=side.peers.instance_id,
            write_by=time.time() + 60.0,
            token=token,
            prompt=PROMPT,
        ),
    )
    # This process is the target of the writes: it must keep driving NIXL progress.
    answer: WriteDone | WriteFailed | None = None
    deadline = time.monotonic() + 20.0
    while answer is None and time.monotonic() < deadline:
        side.engine.progress()
        for inbound in side.channel.drain(POLL_S):
            message = inbound.message
            if isinstance(message, WriteDone | WriteFailed) and message.transfer_id == tid:
                answer = message
    assert answer == WriteDone(tid, token)  # the verdict echoes the announcement's capability
    wrote = producer.expect("wrote", 5.0)
    assert (wrote["transfer_id"], wrote["ok"], wrote["errors"]) == (tid, True, [])

    source = producer_blocks[first_block:]
    assert wrong_chunks(side, dest_ids, source, src_seed=PRODUCER_SEED) == []
    want = digest([pattern(PRODUCER_SEED, i, PRODUCER_BLOCKS) for i in range(NUM_LAYERS)])
    assert producer.command("digest", "digest")["sha256"] == want
    stats = producer.command("stats", "stats")
    assert (stats["handshakes"], stats["handshake_failures"]) == (1, 0)
    assert stats["channel_rejected"] == {}
    assert side.peers.rejected_requests == 0
    side.close()
    assert producer.stop() == 0


def assert_dead_peer_fails_fast(
    side: KvSide, producer: PeerProcess, handshake_timeout: float
) -> None:
    """After the kill: posts fail at once, nothing stays in flight, handshakes fail in time."""
    assert producer.proc.wait(timeout=10) == -signal.SIGKILL
    requests, _ = side.posts("after", TransferOp.READ, producer.address, [0, 1], [1, 0])
    results = side.run(requests, timeout=5.0)
    assert len(results) == NUM_LAYERS
    assert len(failures(results)) == NUM_LAYERS
    assert side.poster.num_inflight == 0

    side.peers.forget(producer.address)
    started = time.monotonic()
    with pytest.raises(PeerUnavailableError, match=f"{producer.address} failed: no reply"):
        side.peers.connect(producer.address)
    assert time.monotonic() - started < handshake_timeout + 1.0
    assert side.peers.handshake_failures == 1


@pytest.mark.timeout(60)
def test_peer_killed_while_reads_stream_fails_them_without_waiting_for_a_timeout(
    spawn: Spawn, open_side: OpenSide
) -> None:
    # Default transports: cross-memory attach copies inside post(), so the kill lands
    # part-way through the 32 layer batches of a transfer.
    handshake_timeout = 1.0
    producer = start_producer(spawn, TransferMode.READ, seed=3)
    side = open_side(
        num_layers=NUM_LAYERS,
        num_blocks=CONSUMER_BLOCKS,
        seed=CONSUMER_SEED,
        handshake_timeout=handshake_timeout,
    )
    every_block = list(range(CONSUMER_BLOCKS))
    requests, _ = side.posts(
        "loop", TransferOp.READ, producer.address, every_block, every_block[::-1]
    )

    streaming = threading.Event()
    killed_at: list[float] = []

    def kill_while_streaming() -> None:
        if streaming.wait(30.0):
            time.sleep(0.05)
            killed_at.append(time.monotonic())
            producer.proc.kill()  # SIGKILL

    killer = threading.Thread(target=kill_while_streaming, daemon=True)
    killer.start()
    failed_at: float | None = None
    failed: list[str] = []
    rounds = 0
    deadline = time.monotonic() + 30.0
    try:
        while not failed and time.monotonic() < deadline:
            batch = [replace(r, transfer_id=f"loop-{rounds}") for r in requests]
            results = side.run(batch, timeout=5.0)
            assert len(results) == len(batch), "a READ neither finished nor failed in 5 s"
            failed = failures(results)
            if failed:
                failed_at = time.monotonic()
            rounds += 1
            if rounds == 3:
                streaming.set()
    finally:
        streaming.set()
        killer.join(15.0)
    assert killed_at, "the peer was never killed"
    assert failed_at is not None, f"no READ failed after the kill ({rounds} rounds)"
    assert rounds > 3  # the rounds before the kill all succeeded
    assert failed_at - killed_at[0] < DEAD_PEER_FAILS_WITHIN_S, failed
    assert all("nixlRemoteDisconnectError" in f for f in failed), failed
    assert_dead_peer_fails_fast(side, producer, handshake_timeout)


@pytest.mark.timeout(60)
def test_peer_killed_with_reads_in_flight_fails_them_without_waiting_for_a_timeout(
    spawn: Spawn, open_side: OpenSide, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pure TCP: the target's worker serves every READ, so while the peer stops polling the
    # batches stay in flight, and the kill lands on transfers that have certainly started.
    monkeypatch.setenv("UCX_TLS", "tcp")
    handshake_timeout = 1.0
    producer = start_producer(spawn, TransferMode.READ, seed=3)
    side = open_side(
        num_layers=NUM_LAYERS,
        num_blocks=CONSUMER_BLOCKS,
        seed=CONSUMER_SEED,
        handshake_timeout=handshake_timeout,
    )
    local_ids, remote_ids = [0, 1, 2, 3], [15, 14, 13, 12]
    requests, _ = side.posts("warm", TransferOp.READ, producer.address, local_ids, remote_ids)
    assert failures(side.run(requests, timeout=20.0)) == []

    producer.command("pause", "paused", seconds=30.0)
    for request in requests:
        side.poster.submit(replace(request, transfer_id="stalled"))
    for _ in range(50):
        assert side.poster.progress() == []
        time.sleep(POLL_S)
    assert side.poster.inflight("stalled") == NUM_LAYERS

    killed_at = time.monotonic()
    producer.proc.kill()  # SIGKILL
    results: list[PostResult] = []
    while len(results) < NUM_LAYERS and time.monotonic() < killed_at + 2 * DEAD_PEER_FAILS_WITHIN_S:
        results.extend(side.poster.progress())
        time.sleep(POLL_S)
    failed_at = time.monotonic()
    assert len(results) == NUM_LAYERS, "in-flight READs neither finished nor failed"
    assert failed_at - killed_at < DEAD_PEER_FAILS_WITHIN_S
    failed = failures(results)
    assert len(failed) == NUM_LAYERS
    assert all("polling failed: nixlRemoteDisconnectError" in f for f in failed), failed
    assert_dead_peer_fails_fast(side, producer, handshake_timeout)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("field", "peer_args"),
    [("dtype", ["--dtype", "float16"]), ("num_layers", ["--num-layers", "3"])],
)
def test_incompatible_fingerprint_fails_the_handshake_naming_the_field(
    spawn: Spawn, open_side: OpenSide, field: str, peer_args: list[str]
) -> None:
    peer = spawn("--num-blocks", "2", "--num-layers", "2", *peer_args)
    side = open_side(num_layers=2, num_blocks=2, seed=CONSUMER_SEED, handshake_timeout=5.0)

    # We dial: the peer checks our fingerprint and rejects us.
    with pytest.raises(PeerUnavailableError, match=f"rejected our handshake.*{field} differs"):
        side.peers.connect(peer.address)
    assert (side.peers.handshakes, side.peers.handshake_failures) == (0, 1)
    assert peer.command("stats", "stats")["rejected_requests"] == 1

    # The peer dials: we check its fingerprint and reject it.
    address = side.channel.address
    reply = peer.command("connect", "connect_failed", host=address.host, port=address.port)
    assert f"{field} differs" in reply["error"]
    assert side.peers.rejected_requests == 1
