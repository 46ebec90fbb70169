"""A worker's KV-cache memory for tests: one numpy buffer, seeded block contents, poison.

Every layer is a ``[2, num_blocks, block_size, heads, head_size]`` int32 view (the SEPARATED
layout) of one buffer, so a request's blocks are filled or checked across all layers in one
numpy operation; as vLLM's buffer is, it is named as the layers' storage (``spans``), so a
request moves in one batch between two such memories. A block's content is a pure function
of (request uid, layer, K/V, logical block index), so a consumer knows exactly what the
producer wrote. Free blocks hold a poison value; finding anything else in a free block means
a transfer wrote into it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from moriio.domain.kv.layout import LayerSpec
from moriio.domain.worker.kv_registry import LayerTensor
from moriio.ports import Allocation

POISON = np.int32(-(2**31))
HEADS = 1
HEAD_SIZE = 2
_ITEMSIZE = 4

Blocks = Sequence[int]


class KVMemory:
    """All layers of one node's KV cache, in one buffer."""

    def __init__(
        self, num_layers: int, num_blocks: int, block_size: int, *, spans: bool = True
    ) -> None:
        """``spans``: name the buffer as the layers' storage (False: each layer alone)."""
        self.spans = spans
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layer_names = tuple(f"model.layers.{i}.self_attn.attn" for i in range(num_layers))
        self.buffer = np.full(
            (num_layers, 2, num_blocks, block_size * HEADS * HEAD_SIZE), POISON, dtype=np.int32
        )
        per_block = block_size * HEADS * HEAD_SIZE
        self._elements = np.arange(per_block, dtype=np.int32)
        self._layer_off = (np.arange(num_layers, dtype=np.int32) * 7919).reshape(-1, 1, 1, 1)
        self._kv_off = np.array([0, 104729], dtype=np.int32).reshape(1, 2, 1, 1)

    def tensors(self) -> list[LayerTensor]:
        """The layers as the domain registers them."""
        spec = LayerSpec(block_size=self.block_size, num_kv_heads=HEADS, head_size=HEAD_SIZE)
        shape = (2, self.num_blocks, self.block_size, HEADS, HEAD_SIZE)
        strides = (
            self.num_blocks * self.block_size * HEADS * HEAD_SIZE,
            self.block_size * HEADS * HEAD_SIZE,
            HEADS * HEAD_SIZE,
            HEAD_SIZE,
            1,
        )
        base = self.buffer.ctypes.data
        layer_bytes = self.buffer[0].nbytes
        storage = Allocation(base, self.buffer.nbytes) if self.spans else None
        return [
            LayerTensor(
                name=name,
                addr=base + i * layer_bytes,
                shape=shape,
                strides=strides,
                itemsize=_ITEMSIZE,
                dtype="int32",
                spec=spec,
                storage=storage,
            )
            for i, name in enumerate(self.layer_names)
        ]

    def expected(
        self, uid: int, first_block: int, count: int, layer: int | None = None
    ) -> npt.NDArray[np.int32]:
        """What logical blocks ``first_block .. first_block+count`` of request ``uid`` hold
        (in every layer, or in ``layer`` only)."""
        logical = np.arange(first_block, first_block + count, dtype=np.int32).reshape(1, 1, -1, 1)
        base = np.int32((uid * 1_000_003) % (1 << 30))
        layers = self._layer_off if layer is None else self._layer_off[layer : layer + 1]
        values: npt.NDArray[np.int32] = (
            base + layers + self._kv_off + logical * 131 + self._elements
        )
        return values

    def write(self, uid: int, blocks: Blocks, first_block: int) -> None:
        """The forward pass: fill ``blocks`` with request ``uid``'s KV (every layer)."""
        if blocks:
            self.buffer[:, :, list(blocks)] = self.expected(uid, first_block, len(blocks))

    def write_layer(self, layer: int, uid: int, blocks: Blocks, first_block: int) -> None:
        """The forward pass of one layer: fill ``blocks`` of ``layer`` with ``uid``'s KV."""
        if blocks:
            values = self.expected(uid, first_block, len(blocks), layer)[0]
            self.buffer[layer][:, list(blocks)] = values

    def holds(self, uid: int, blocks: Blocks, first_block: int) -> bool:
        """Whether ``blocks`` hold exactly request ``uid``'s KV in every layer."""
        if not blocks:
            return True
        return bool(
            np.array_equal(
                self.buffer[:, :, list(blocks)], self.expected(uid, first_block, len(blocks))
            )
        )

    def poison(self, blocks: Blocks) -> None:
        if blocks:
            self.buffer[:, :, list(blocks)] = POISON

    def dirty_blocks(self, blocks: Blocks) -> list[int]:
        """Those of ``blocks`` whose content is not the poison value (written while free)."""
        if not blocks:
            return []
        view = self.buffer[:, :, list(blocks)]
        clean = (view == POISON).all(axis=(0, 1, 3))
        return [b for b, ok in zip(blocks, clean.tolist(), strict=True) if not ok]
