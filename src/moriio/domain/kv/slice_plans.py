"""Plans of a transfer between two ranks of different TP sizes: whole pages where both ranks
hold the same units, slices where their KV heads or state are split differently.

One :class:`SlicedPlans` belongs to one transfer with one peer rank: its block pairs (one run
per KV-cache group, in group order) and the two ranks. Each layer's plan joins, group by
group, either the whole-page plan of the planner (MLA's latent, replicated heads, a state
every rank holds) or the per-block template of the units this pair of ranks moves
(:func:`moriio.domain.kv.head_slices.slice_template`). Templates are cached by the two
layouts and the share, plans by the layer's geometry key and both sides' layouts, so every
layer of one geometry reuses one computation, as :class:`~moriio.domain.kv.plan_cache.PlanCache`
does for equal TP sizes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moriio.domain.kv.geometry import LayerGeometry
from moriio.domain.kv.head_slices import (
    GroupSlicing,
    Share,
    SliceLayout,
    Unsliceable,
    plan_slices,
    slice_template,
)
from moriio.domain.kv.planner import (
    BlockIds,
    Int64Array,
    TransferPlan,
    as_block_ids,
    as_num_blocks,
    plan_transfer,
)
from moriio.domain.kv.shards import moved_units, rank_units


@dataclass(frozen=True, slots=True)
class RankPair:
    """This rank and the peer rank of a transfer, and which of them consumes the KV."""

    local_rank: int
    local_tp: int
    remote_rank: int
    remote_tp: int
    local_consumes: bool

    def share(self, layout: SliceLayout) -> Share:
        """The units of each plane of ``layout`` the producer rank moves to the consumer."""
        moved, ours, theirs = [], [], []
        for plane in layout.planes:
            total = plane.total_units
            mine = rank_units(self.local_rank, self.local_tp, total)
            peer = rank_units(self.remote_rank, self.remote_tp, total)
            if self.local_consumes:
                moved.append(moved_units(total, self.remote_rank, self.remote_tp, *self._local))
            else:
                moved.append(moved_units(total, *self._local, self.remote_rank, self.remote_tp))
            ours.append(mine.start)
            theirs.append(peer.start)
        return Share(tuple(moved), tuple(ours), tuple(theirs))

    @property
    def _local(self) -> tuple[int, int]:
        return self.local_rank, self.local_tp

    def holds_the_same(self, layout: SliceLayout) -> bool:
        """Whether both ranks hold exactly the units this pair moves (a whole-page copy)."""
        share = self.share(layout)
        for plane, moved in zip(layout.planes, share.moved, strict=True):
            total = plane.total_units
            mine = rank_units(self.local_rank, self.local_tp, total)
            peer = rank_units(self.remote_rank, self.remote_tp, total)
            if not (moved == mine == peer):
                return False
        return True

    def moves_anything(self, slicing: Sequence[GroupSlicing]) -> bool:
        """Whether this pair moves any unit of a layer sliced as ``slicing`` (whole pages
        move between the first producer rank of a group only)."""
        for layout in slicing:
            if isinstance(layout, SliceLayout):
                if any(self.share(layout).moved):
                    return True
            elif self._first_producer():
                return True
        return not slicing and self._first_producer()

    def _first_producer(self) -> bool:
        """Whether the producer rank of this pair is the first of the consumer's group."""
        if self.local_consumes:
            consumer, consumer_tp, producer, producer_tp = self._local + self._remote
        else:
            consumer, consumer_tp, producer, producer_tp = self._remote + self._local
        return producer == consumer * producer_tp // consumer_tp

    @property
    def _remote(self) -> tuple[int, int]:
        return self.remote_rank, self.remote_tp


class SlicedPlans:
    """Plans for one transfer's block pairs with one peer rank (see the module docstring)."""

    def __init__(
        self,
        local_block_ids: BlockIds,
        remote_block_ids: BlockIds,
        group_sizes: Sequence[int],
        remote_num_blocks: int,
        ranks: RankPair,
    ) -> None:
        local = as_block_ids(local_block_ids, "local").copy()
        remote = as_block_ids(remote_block_ids, "remote")[: local.size].copy()
        sizes = tuple(group_sizes) or (local.size,)
        if sum(sizes) != local.size or any(s < 0 for s in sizes):
            raise ValueError(f"group sizes {sizes} do not add up to {local.size} block pairs")
        bounds = [0, *itertools.accumulate(sizes)]
        self._groups = [(local[a:b], remote[a:b]) for a, b in itertools.pairwise(bounds)]
        self._remote_num_blocks = as_num_blocks(remote_num_blocks, "remote_num_blocks")
        self.ranks = ranks
        self._templates: dict[object, tuple[Int64Array, Int64Array, Int64Array]] = {}
        self._plans: dict[object, TransferPlan] = {}
        self.computations = 0
        self.hits = 0

    def plan_for(
        self,
        name: str,
        geometry: LayerGeometry,
        local: Sequence[GroupSlicing],
        remote: Sequence[SliceLayout | None],
        remote_block_len: int,
        remote_stride: int,
    ) -> TransferPlan:
        """The plan of layer ``name``; ValueError names the layer and why it cannot move."""
        key = (geometry.key, remote_stride, remote_block_len, tuple(local), tuple(remote))
        plan = self._plans.get(key)
        if plan is not None:
            self.hits += 1
            return plan
        parts = []
        slicing = tuple(local) or (None,) * len(self._groups)
        if len(slicing) != len(self._groups):
            raise ValueError(
                f"layer {name!r}: {len(slicing)} sliced groups, the transfer has "
                f"{len(self._groups)}"
            )
        theirs = tuple(remote) or (None,) * len(slicing)
        for g, ((lids, rids), ours) in enumerate(zip(self._groups, slicing, strict=True)):
            peer = theirs[g] if g < len(theirs) else None
            parts.append(
                self._group_plan(
                    name, geometry, ours, peer, lids, rids, remote_block_len, remote_stride
                )
            )
        plan = _join(parts)
        self._plans[key] = plan
        self.computations += 1
        return plan

    def _group_plan(
        self,
        name: str,
        geometry: LayerGeometry,
        ours: GroupSlicing,
        theirs: SliceLayout | None,
        lids: Int64Array,
        rids: Int64Array,
        remote_block_len: int,
        remote_stride: int,
    ) -> TransferPlan:
        if isinstance(ours, Unsliceable):
            raise ValueError(f"layer {name!r} cannot be sliced between TP sizes: {ours.reason}")
        if ours is not None and theirs is None:
            raise ValueError(f"layer {name!r}: the peer moves only whole pages of a sliced layer")
        if ours is None or self.ranks.holds_the_same(ours):
            if remote_block_len != geometry.block_len:
                raise ValueError(
                    f"layer {name!r}: whole pages differ in length (ours {geometry.block_len}, "
                    f"theirs {remote_block_len})"
                )
            if not self.ranks.moves_anything((ours,) if ours is not None else ()):
                return _empty_plan()
            return plan_transfer(geometry, lids, rids, self._remote_num_blocks, remote_stride)
        assert theirs is not None
        share = self.ranks.share(ours)
        tkey = (ours, theirs, share)
        template = self._templates.get(tkey)
        if template is None:
            template = self._templates[tkey] = slice_template(ours, theirs, share)
        return plan_slices(template, lids, rids, geometry.block_stride_bytes, remote_stride)


def _empty_plan() -> TransferPlan:
    empty = np.zeros(0, dtype=np.int64)
    return TransferPlan(empty, empty.copy(), empty.copy())


def _join(parts: Sequence[TransferPlan]) -> TransferPlan:
    if len(parts) == 1:
        return parts[0]
    return TransferPlan(
        np.concatenate([p.local_offsets for p in parts]),
        np.concatenate([p.remote_offsets for p in parts]),
        np.concatenate([p.sizes for p in parts]),
    )
