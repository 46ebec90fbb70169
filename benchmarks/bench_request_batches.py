"""A READ request over NIXL loopback: one batch per request against one batch per layer.

    .venv/bin/python benchmarks/bench_request_batches.py [--layers 32] [--blocks 64] ...

Two workers in this process (the composition a connector runs, NIXL for the transport),
each with a KV buffer of ``--layers`` layers (a K plane and a V plane per layer); the
consumer loads ``--blocks`` blocks in random order, asynchronously. The same request is
timed, in alternating rounds of one run, with the buffers named as the layers' storage
(spans: the whole request in one batch) and without (a batch per layer), from the read
order to the load reported finished; the bytes are checked every round. Prints both
medians, posts and descriptors per request, and the ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid

import numpy as np

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.adapters.nixl import NixlTransferEngine
from moriio.domain.params.orders import HoldOrder, ReadOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

PRODUCER, CONSUMER = Endpoint(7300, 7400), Endpoint(8300, 8400)
TIMING = Timing(transfer_timeout=60.0, defer_timeout=120.0, handshake_timeout=10.0)


class Pair:
    """A producer and a consumer worker over NIXL; ``spans``: buffers named as storage."""

    def __init__(self, layers: int, num_blocks: int, block_size: int, spans: bool) -> None:
        clock = FakeClock()
        fabric, network = InMemoryFabric(), InMemoryNetwork(clock)
        self.memories = [KVMemory(layers, num_blocks, block_size, spans=spans) for _ in range(2)]
        tag = uuid.uuid4().hex[:6]
        self.stacks: list[Stack] = [
            build_stack(
                name=f"{name}-{tag}",
                mode=TransferMode.READ,
                is_producer=is_producer,
                endpoint=PRODUCER if is_producer else CONSUMER,
                memory=memory,
                clock=clock,
                fabric=fabric,
                network=network,
                timing=TIMING,
                rng=random.Random(1),
                engine_plan=EngineFaultPlan(),
                channel_plan=ChannelFaultPlan(),
                inner=NixlTransferEngine(f"{name}-{tag}", loopback=True),
            )
            for name, is_producer, memory in (
                ("producer", True, self.memories[0]),
                ("consumer", False, self.memories[1]),
            )
        ]
        self.rounds = 0

    def read(self, local: tuple[int, ...], remote: tuple[int, ...]) -> float:
        """One asynchronous READ; seconds from the order to the load reported finished."""
        producer, consumer = (s.service for s in self.stacks)
        p_memory, d_memory = self.memories
        self.rounds += 1
        uid, tid = self.rounds, f"tx-{self.rounds}"
        p_memory.write(uid, remote, 0)
        d_memory.poison(local)
        producer.start_step(StepOrders(holds=[HoldOrder(f"p-{uid}", tid)]), 0.0)
        peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
        order = ReadOrder(f"d-{uid}", tid, local, remote, peer, None, load_async=True)
        start = time.perf_counter()
        consumer.start_step(StepOrders(reads=[order]), 0.0)
        while f"d-{uid}" not in consumer.finish_step().finished_recving:
            producer.pump()
        elapsed = time.perf_counter() - start
        if not d_memory.holds(uid, local, 0):
            raise AssertionError("the READ moved the wrong bytes")
        producer.pump()
        producer.finish_step()
        return elapsed

    def stats(self) -> tuple[int, int]:
        poster = self.stacks[1].service.ctx.poster.stats
        return poster.posts, poster.descriptors

    def close(self) -> None:
        for stack in self.stacks:
            stack.crash()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=64, help="blocks per request")
    parser.add_argument("--cache-blocks", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=64, help="tokens (8 B each per half)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    pairs = {
        spans: Pair(args.layers, args.cache_blocks, args.block_size, spans)
        for spans in (True, False)
    }
    rng = np.random.default_rng(0)
    samples: dict[bool, list[float]] = {True: [], False: []}
    try:
        for round_ in range(args.rounds + 1):  # the first round handshakes: not counted
            local = tuple(
                int(b) for b in rng.choice(range(1, args.cache_blocks), args.blocks, False)
            )
            remote = tuple(
                int(b) for b in rng.choice(range(1, args.cache_blocks), args.blocks, False)
            )
            for spans in (True, False) if round_ % 2 else (False, True):
                seconds = pairs[spans].read(local, remote)
                if round_:
                    samples[spans].append(seconds)
        counted = {s: [x / max(p.rounds, 1) for x in p.stats()] for s, p in pairs.items()}
    finally:
        for pair in pairs.values():
            pair.close()
    chunk = args.block_size * 8
    total = args.layers * 2 * args.blocks * chunk
    print(
        f"READ of {args.blocks} random blocks x {args.layers} layers x K/V ({chunk} B chunks, "
        f"{total / 2**20:.1f} MiB), NIXL loopback in one process, median of {args.rounds}"
    )
    for spans, label in ((False, "a batch per layer"), (True, "one batch per request")):
        posts, descriptors = counted[spans]
        median = statistics.median(samples[spans])
        print(
            f"  {label:22}  {median * 1e3:8.2f} ms  {posts:5.1f} posts  "
            f"{descriptors:8.1f} descriptors per request"
        )
    ratio = statistics.median(samples[False]) / statistics.median(samples[True])
    print(f"  one batch per request: {ratio:.2f}x the per-layer path's speed")


if __name__ == "__main__":
    main()
