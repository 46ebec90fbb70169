"""Workers of one TP group each, on the in-memory adapters: KV heads split across ranks.

Every rank's KV cache is ``layers`` page views ``[num_blocks, heads, block_size, 2 * head]``
(int32) of one buffer, holding its share of ``total_heads`` KV heads as vLLM shards them,
in HND order (a rank's heads together in a page) or NHD (one run per token). A block's
content is a pure function of (request uid, layer, logical block, global head, token,
element), so a consumer rank knows exactly what its heads must hold, whatever ranks they
came from. Free blocks hold a poison value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from moriio.bootstrap import HandshakeTiming, WorkerIdentity, WorkerPorts, bootstrap
from moriio.domain.kv.layout import LayerSpec, describe_layout
from moriio.domain.kv.shards import rank_units
from moriio.domain.kv.slice_layouts import HeadOrder, head_slices
from moriio.domain.params.transfer_params import PeerEndpoint, port_offset
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.messages import Message
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.kv_registry import LayerTensor
from moriio.domain.worker.service import WorkerService
from moriio.testing.handoffs import TEST_HANDOFF_KEY
from moriio.testing.inmemory import (
    FakeClock,
    InMemoryControlChannel,
    InMemoryFabric,
    InMemoryNetwork,
    InMemoryTransferEngine,
)
from moriio.testing.stacks.stack import HOST, Timing

POISON = np.int32(-(2**31))
LAYERS, BLOCKS, BLOCK_SIZE, HEAD = 2, 12, 4, 2


class HeadMemory:
    """One rank's KV cache (see the module docstring)."""

    def __init__(
        self, total_heads: int, tp: int, rank: int, *, hnd: bool = True, head: int = HEAD
    ) -> None:
        self.heads = rank_units(rank, tp, total_heads)
        self.total, self.tp, self.hnd, self.cell = total_heads, tp, hnd, 2 * head
        h = len(self.heads)
        # dims in memory order: HND [layer, block, head, token, c], NHD [.., token, head, c]
        dims = (h, BLOCK_SIZE) if hnd else (BLOCK_SIZE, h)
        self.buffer = np.full((LAYERS, BLOCKS, *dims, self.cell), POISON, dtype=np.int32)

    def page_view(self) -> tuple[np.ndarray, ...]:
        """Each layer as the view ``[block, head, token, c]``."""
        views = [self.buffer[layer] for layer in range(LAYERS)]
        return tuple(v if self.hnd else v.transpose(0, 2, 1, 3) for v in views)

    def tensors(self, order: HeadOrder = HeadOrder.SLOTS) -> list[LayerTensor]:
        spec = LayerSpec(BLOCK_SIZE, len(self.heads), self.cell // 2)
        out = []
        for layer, view in enumerate(self.page_view()):
            strides = tuple(s // 4 for s in view.strides)
            geometry = describe_layout(view.shape, strides, 4, spec)
            slicing = (head_slices(geometry, order, self.total, self.tp),)
            out.append(
                LayerTensor(
                    name=f"model.layers.{layer}.self_attn.attn",
                    addr=view.ctypes.data,
                    shape=view.shape,
                    strides=strides,
                    itemsize=4,
                    dtype="int32",
                    spec=spec,
                    slicing=slicing,
                )
            )
        return out

    def expected(self, uid: int, first_block: int, count: int) -> npt.NDArray[np.int32]:
        """``[layer, block, head, token, c]`` of logical blocks ``first_block ..`` of ``uid``
        for this rank's heads."""
        layer = np.arange(LAYERS).reshape(-1, 1, 1, 1, 1)
        block = np.arange(first_block, first_block + count).reshape(1, -1, 1, 1, 1)
        head = np.array(self.heads).reshape(1, 1, -1, 1, 1)
        token = np.arange(BLOCK_SIZE).reshape(1, 1, 1, -1, 1)
        c = np.arange(self.cell).reshape(1, 1, 1, 1, -1)
        value = uid * 1_000_003 + layer * 7919 + block * 131 + head * 977 + token * 17 + c
        return (value % (1 << 30)).astype(np.int32)

    def _blocks(self, blocks: Sequence[int]) -> np.ndarray:
        return np.stack([v[list(blocks)] for v in self.page_view()])

    def write(self, uid: int, blocks: Sequence[int], first_block: int) -> None:
        """The forward pass: fill ``blocks`` with ``uid``'s KV of this rank's heads."""
        values = self.expected(uid, first_block, len(blocks))
        for layer, view in enumerate(self.page_view()):
            view[list(blocks)] = values[layer]

    def holds(self, uid: int, blocks: Sequence[int], first_block: int) -> bool:
        return bool(
            np.array_equal(self._blocks(blocks), self.expected(uid, first_block, len(blocks)))
        )

    def untouched(self, blocks: Sequence[int]) -> bool:
        return bool((self._blocks(blocks) == POISON).all())


@dataclass(frozen=True, slots=True)
class Group:
    """One engine: its TP ranks' services and memories, and its base ports."""

    services: tuple[WorkerService, ...]
    memories: tuple[HeadMemory, ...]
    handshake_port: int
    notify_port: int
    engines: tuple[InMemoryTransferEngine, ...]

    def endpoint(self) -> PeerEndpoint:
        tp = len(self.services)
        return PeerEndpoint(HOST, self.handshake_port, self.notify_port, tp_size=tp)


def engine_group(
    name: str,
    *,
    producer: bool,
    mode: TransferMode,
    tp: int,
    total_heads: int,
    base_port: int,
    clock: FakeClock,
    fabric: InMemoryFabric,
    net: InMemoryNetwork,
    hnd: bool = True,
    head: int = HEAD,
    timing: Timing | None = None,
) -> Group:
    """``tp`` workers of one engine, ranks on ports offset as vLLM's ranks are."""
    timing = timing or Timing()
    services, memories, engines = [], [], []
    for rank in range(tp):
        offset = port_offset(0, rank, tp)
        memory = HeadMemory(total_heads, tp, rank, hnd=hnd, head=head)
        engine = InMemoryTransferEngine(f"{name}#{rank}", fabric, seed=rank)
        notify: InMemoryControlChannel[Message] = InMemoryControlChannel(
            net, WIRE_CODEC, HOST, base_port + 100 + offset
        )
        handshake: InMemoryControlChannel[Message] = InMemoryControlChannel(
            net, WIRE_CODEC, HOST, base_port + offset
        )
        fingerprint = Fingerprint(
            model_name="tp-model",
            dtype="int32",
            block_size=BLOCK_SIZE,
            layout_kinds=("packed",) * LAYERS,
            tp_size=tp,
            transfer_mode=mode,
            total_num_kv_heads=total_heads,
            is_mla=False,
        )
        identity = WorkerIdentity(
            engine_name=name,
            host=HOST,
            bind_host=HOST,
            handshake_port=base_port + offset,
            notify_port=base_port + 100 + offset,
            tp_rank=rank,
            tp_size=tp,
            dp_rank=0,
            is_producer=producer,
            is_consumer=not producer,
            fingerprint=fingerprint,
            instance_id=name,  # one per engine, as vLLM stamps it on every rank
        )
        ports = WorkerPorts(
            engine=engine,
            notify=notify,
            handshake=handshake,
            clock=clock,
            background_handshakes=False,
        )
        worker = bootstrap(
            ports,
            identity,
            memory.tensors(),
            mode=mode,
            policy=timing.policy,
            handshakes=HandshakeTiming(timing.handshake_timeout, timing.handshake_retry_after),
            poll_interval=timing.poll_interval,
        )
        if mode is TransferMode.READ and producer:
            worker.service.set_handoff_key(TEST_HANDOFF_KEY)  # as the engine's scheduler does
        services.append(worker.service)
        memories.append(memory)
        engines.append(engine)
    return Group(tuple(services), tuple(memories), base_port, base_port + 100, tuple(engines))
