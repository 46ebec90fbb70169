"""Per-transfer plan cache: every layer with the same geometry key reuses one plan.

One :class:`PlanCache` belongs to one transfer, i.e. one fixed pair of block-id lists and
one peer block count; it dies with the transfer. Layers of a model mostly share a geometry,
so a transfer computes one plan per distinct geometry (for example one for the dense K/V
layers and one for an MLA indexer layer), not one per layer.

Not synchronised: use it from one thread (two threads racing on a miss would at worst
compute the same plan twice).
"""

from __future__ import annotations

from moriio.domain.kv.layout import GeometryKey, LayerGeometry
from moriio.domain.kv.planner import (
    BlockIds,
    TransferPlan,
    as_block_ids,
    as_num_blocks,
    plan_transfer,
)


class PlanCache:
    """Plans for one transfer's block ids, keyed by :attr:`LayerGeometry.key`."""

    __slots__ = ("_local", "_plans", "_remote", "_remote_num_blocks", "computations", "hits")

    def __init__(
        self, local_block_ids: BlockIds, remote_block_ids: BlockIds, remote_num_blocks: int
    ) -> None:
        # Private copies: a caller reusing its arrays must not change cached plans' inputs.
        self._local = as_block_ids(local_block_ids, "local").copy()
        self._remote = as_block_ids(remote_block_ids, "remote").copy()
        self._remote_num_blocks = as_num_blocks(remote_num_blocks, "remote_num_blocks")
        self._plans: dict[tuple[GeometryKey, int | None], TransferPlan] = {}
        self.computations = 0
        self.hits = 0

    def plan_for(
        self, geometry: LayerGeometry, remote_block_stride: int | None = None
    ) -> TransferPlan:
        """The plan for a layer of this geometry (and the peer layer's block stride, when it
        differs from ours), computed on the first request only."""
        key = (geometry.key, remote_block_stride)
        plan = self._plans.get(key)
        if plan is not None:
            self.hits += 1
            return plan
        plan = plan_transfer(
            geometry, self._local, self._remote, self._remote_num_blocks, remote_block_stride
        )
        self._plans[key] = plan
        self.computations += 1
        return plan

    def __len__(self) -> int:
        return len(self._plans)
