"""Recurrent state sliced between TP sizes as vLLM shards it, byte for byte.

The state pages are vLLM's: shapes from ``MambaStateShapeCalculator`` for each TP size (both
convolution layouts, ``SD`` and ``DS``), packed into a page by ``MambaBase.bind_kv_cache``.
What a rank must hold comes from vLLM's own weight loader for the layer's ``conv1d``
(``mamba_v2_sharded_weight_loader`` with the layer's sub-projections: ``q, k, v`` for a
Gated-DeltaNet, ``x, B, C`` for Mamba2), applied to the TP 1 state's channels, and the
recurrent state's heads sharded the same way. The layout comes from
:func:`moriio.vllm_plugin.tp_slicing.state_slicing` reading a layer with the attributes
vLLM's layer classes carry; the plan from the domain's planner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.mamba.mamba_mixer2 import mamba_v2_sharded_weight_loader
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateShapeCalculator,
    get_conv_state_layout,
)
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import MambaSpec

from moriio.domain.kv.head_slices import SliceLayout, Unsliceable
from moriio.domain.kv.slice_plans import RankPair, SlicedPlans
from moriio.vllm_plugin.tp_slicing import state_slicing

BLOCKS_C, BLOCKS_P = 5, 7
PAIRS = [(3, 6), (0, 1), (4, 0)]  # (consumer block, producer block)
DTYPES = (torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Model:
    """A layer kind: its vLLM type, its attributes, its shapes per TP size and the
    sub-projections its ``conv1d`` weight loader shards (full sizes, in order)."""

    kind: MambaAttentionBackendEnum
    attrs: dict[str, int]
    shapes: Callable[[int], tuple[tuple[int, ...], ...]]
    conv_parts: tuple[int, ...]


GDN = Model(
    MambaAttentionBackendEnum.GDN_ATTN,
    {"num_k_heads": 2, "num_v_heads": 4, "head_k_dim": 16, "head_v_dim": 16},
    lambda tp: MambaStateShapeCalculator.gated_delta_net_state_shape(tp, 2, 4, 16, 16, 4),
    (2 * 16, 2 * 16, 4 * 16),
)
MAMBA2 = Model(
    MambaAttentionBackendEnum.MAMBA2,
    {"num_heads": 8, "head_dim": 8, "n_groups": 2, "ssm_state_size": 16},
    lambda tp: MambaStateShapeCalculator.mamba2_state_shape(tp, 64, 2, 8, 8, 16, 4),
    (64, 2 * 16, 2 * 16),
)


class _Pages:
    """One rank's state pages: a raw buffer and vLLM's per-state views of it."""

    def __init__(self, model: Model, tp: int, blocks: int, seed: int) -> None:
        self.shapes = model.shapes(tp)
        self.page = 64 + sum(
            int(np.prod(s)) * d.itemsize for s, d in zip(self.shapes, DTYPES, strict=True)
        )  # padded, as the page a hybrid model's attention layer sets
        rng = np.random.default_rng(seed)
        self.raw = torch.from_numpy(rng.integers(0, 256, blocks * self.page, dtype=np.uint8))
        self.spec = MambaSpec(
            block_size=16,
            shapes=self.shapes,
            dtypes=DTYPES,
            page_size_padded=self.page,
            mamba_type=model.kind,
        )
        self.mixer: Any = SimpleNamespace(
            mamba_type=model.kind, tp_size=tp, **model.attrs,
            get_state_shape=lambda: self.shapes, get_state_dtype=lambda: DTYPES,
        )  # fmt: skip

    def states(self, raw: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """vLLM's views of the states (``MambaBase.bind_kv_cache``), of ``raw`` if given."""
        buffer = self.raw if raw is None else raw
        view = buffer.view(torch.int8).view(-1, 1, 1, self.page)
        MambaBase.bind_kv_cache(self.mixer, view)
        states: tuple[torch.Tensor, ...] = self.mixer.kv_cache
        return states


def _conv_channels_first(conv: torch.Tensor) -> torch.Tensor:
    """A block's convolution state with its channels first, whatever the layout."""
    return conv if get_conv_state_layout() == "DS" else conv.transpose(-1, -2)


def _shard(
    model: Model, full: tuple[torch.Tensor, torch.Tensor], tp: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's state as rank ``rank`` of ``tp`` holds it, by vLLM's weight loader."""
    conv = _conv_channels_first(full[0])
    conv_loader = mamba_v2_sharded_weight_loader(
        [(n, 0, False) for n in model.conv_parts], tp, rank
    )
    mine = torch.empty(conv.shape[0] // tp, conv.shape[1], dtype=conv.dtype)
    conv_loader(mine, conv)
    ssm = full[1]
    heads = ssm.shape[0]
    ssm_loader = mamba_v2_sharded_weight_loader([(heads, 0, False)], tp, rank)
    ssm_mine = torch.empty(heads // tp, *ssm.shape[1:], dtype=ssm.dtype)
    ssm_loader(ssm_mine, ssm)
    return (mine if get_conv_state_layout() == "DS" else mine.transpose(0, 1)), ssm_mine


@pytest.fixture(params=["SD", "DS"])
def conv_layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("VLLM_SSM_CONV_STATE_LAYOUT", request.param)
    get_conv_state_layout.cache_clear()
    yield request.param
    get_conv_state_layout.cache_clear()


def _move(
    consumer: _Pages, c: int, c_tp: int, producer: _Pages, p: int, p_tp: int, got: np.ndarray
) -> None:
    ours = state_slicing(consumer.mixer, consumer.spec, c_tp)
    theirs = state_slicing(producer.mixer, producer.spec, p_tp)
    assert isinstance(ours, SliceLayout)
    assert isinstance(theirs, SliceLayout)
    plans = SlicedPlans(
        [a for a, _ in PAIRS], [b for _, b in PAIRS], (), BLOCKS_P, RankPair(c, c_tp, p, p_tp, True)
    )
    # the page view the tensor's attention layer registers: one opaque chunk per block
    from moriio.domain.kv.layout import LayerSpec, describe_layout

    geometry = describe_layout(
        (BLOCKS_C, 1, 1, consumer.page), (consumer.page, consumer.page, consumer.page, 1), 1,
        LayerSpec(16, 1, None, num_states=1, content_bytes=consumer.page),
    )  # fmt: skip
    plan = plans.plan_for("l", geometry, (ours,), (theirs,), producer.page, producer.page)
    src = producer.raw.numpy()
    for lo, ro, n in zip(*plan.to_lists(), strict=True):
        got[lo : lo + n] = src[ro : ro + n]


@pytest.mark.parametrize("model", [GDN, MAMBA2], ids=["gdn", "mamba2"])
@pytest.mark.parametrize(("consumer_tp", "producer_tp"), [(2, 1), (1, 2)])
def test_state_moves_as_vllm_shards_it(
    conv_layout: str, model: Model, consumer_tp: int, producer_tp: int
) -> None:
    assert get_conv_state_layout() == conv_layout
    producers = [_Pages(model, producer_tp, BLOCKS_P, 10 + p) for p in range(producer_tp)]
    consumers = [_Pages(model, consumer_tp, BLOCKS_C, 20 + c) for c in range(consumer_tp)]
    full = _Pages(model, 1, BLOCKS_P, 30)  # every rank's state, as TP 1 holds it
    if producer_tp > 1:  # the producer ranks hold their shards of the full state
        for p, pages in enumerate(producers):
            for b in range(BLOCKS_P):
                block = tuple(s[b] for s in full.states())
                for mine, want in zip(
                    pages.states(), _shard(model, block, producer_tp, p), strict=True
                ):
                    mine[b].copy_(want)
    else:
        producers[0].raw.copy_(full.raw)
    for c, pages in enumerate(consumers):
        got = pages.raw.clone().numpy()
        for p, producer in enumerate(producers):
            _move(pages, c, consumer_tp, producer, p, producer_tp, got)
        expected = pages.raw.clone()
        for lb, rb in PAIRS:
            block = tuple(s[rb] for s in full.states())
            want = block if consumer_tp == 1 else _shard(model, block, consumer_tp, c)
            for mine, value in zip(pages.states(expected), want, strict=True):
                mine[lb].copy_(value)
        assert np.array_equal(got, expected.numpy()), f"consumer rank {c}"
        assert not np.array_equal(got, pages.raw.numpy())


def test_a_state_kind_moriio_cannot_slice_is_named() -> None:
    pages = _Pages(GDN, 1, 2, 0)
    short_conv = SimpleNamespace(mamba_type=MambaAttentionBackendEnum.SHORT_CONV)
    found = state_slicing(short_conv, pages.spec, 1)
    assert isinstance(found, Unsliceable)
    assert "SHORT_CONV state shards" in found.reason
    replicated = MambaSpec(block_size=16, shapes=pages.shapes, dtypes=DTYPES, tp_replicated=True)
    assert state_slicing(pages.mixer, replicated, 1) is None  # every rank holds it whole
    wrong = SimpleNamespace(**{**vars(pages.mixer), "num_v_heads": 8})
    mismatch = state_slicing(wrong, pages.spec, 1)
    assert isinstance(mismatch, Unsliceable)
    assert "does not give its state shapes" in mismatch.reason
