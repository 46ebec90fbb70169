"""vLLM's hybrid KV-cache manager: every group kind moved byte for byte, or refused by name.

The caches are allocated as vLLM 0.32 allocates them (``allocate_kv_cache``: one buffer,
each group's layers overlaid on the same tensors, one page per block), the block tables come
from vLLM's own ``KVCacheManager`` (a prefill that computed the prompt, a decode that
allocated it for an asynchronous load), the pairs from :class:`ConsumerBook`, the plan from
the planner; the plan is applied to the raw bytes, and the decode's views of every block
its manager keeps must then equal the prefill's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.request import Request
from vllm.v1.worker.utils import allocate_kv_cache

from moriio.adapters.device.copier import DeviceCopier
from moriio.config.settings import parse_settings
from moriio.domain.kv.planner import plan_transfer
from moriio.domain.kv.request_plan import Placement, RequestLayer, plan_request
from moriio.domain.scheduler.consumer.book import ConsumerBook
from moriio.domain.values.modes import TransferMode
from moriio.vllm_plugin.fingerprint import group_structure
from moriio.vllm_plugin.kv_views import (
    check_transferable,
    has_state_groups,
    resolve_layers,
)
from moriio.vllm_plugin.support import check_hybrid_settings
from support.read_params import read_params

BS, WINDOW, HEADS, HEAD = 32, 64, 2, 64
FULL = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.bfloat16)
PAGE = FULL.page_size_bytes
SLIDING = SlidingWindowSpec(
    block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.bfloat16, sliding_window=WINDOW
)
CHUNKED = ChunkedLocalAttentionSpec(
    block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.bfloat16, attention_chunk_size=64
)
STATE = MambaSpec(
    block_size=BS,
    shapes=((96, 3), (2, 16, 16)),
    dtypes=(torch.bfloat16, torch.float32),
    page_size_padded=PAGE,
    mamba_cache_mode="align",
)
LATENT = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
LATENT_STATE = replace(STATE, page_size_padded=LATENT.page_size_bytes)
PREFILL_BLOCKS, DECODE_BLOCKS = 40, 57
MAX_LEN = 4096

init_none_hash(sha256_cbor)


def _groups(*specs: KVCacheSpec, layers: int = 2) -> list[KVCacheGroupSpec]:
    """One group per spec, ``layers`` layers each; layer ``i`` of group ``g`` is model
    layer ``i * len(specs) + g`` (vLLM's interleaving of a hybrid model's layers)."""
    return [
        KVCacheGroupSpec([f"model.layers.{i * len(specs) + g}.attn" for i in range(layers)], spec)
        for g, spec in enumerate(specs)
    ]


def _config(groups: list[KVCacheGroupSpec], num_blocks: int) -> KVCacheConfig:
    """Layer-outermost (LBHNC, the CPU order): every group's layer ``i`` overlays slot ``i``."""
    layers, page = len(groups[0].layer_names), groups[0].kv_cache_spec.page_size_bytes
    tensors = [
        KVCacheTensor(page * num_blocks * layers, group.layer_names, page * num_blocks, page)
        for group in groups
    ]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


def _caches(config: KVCacheConfig, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    caches = allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout.LBHNC)
    raw = next(iter(caches.values()))
    base = raw.untyped_storage()
    buffer = torch.empty(0, dtype=torch.uint8).set_(base).view(torch.uint8)
    rng = np.random.default_rng(seed)
    buffer.copy_(torch.from_numpy(rng.integers(0, 256, buffer.numel(), dtype=np.uint8)))
    return buffer, caches


def _request(tokens: int) -> Request:
    hasher = get_request_block_hasher(BS, sha256_cbor)
    params = SamplingParams(max_tokens=1)
    return Request("r", list(range(tokens)), params, None, block_hasher=hasher)


def _prefill_table(config: KVCacheConfig, computed: int) -> tuple[list[int], ...]:
    """The block table the prefill hands off once it computed ``computed`` tokens."""
    manager = KVCacheManager(config, MAX_LEN, BS, hash_block_size=BS, enable_caching=True)
    request = _request(computed)
    assert manager.allocate_slots(request, computed) is not None
    request.num_computed_tokens = computed
    manager.remove_skipped_blocks("r", computed, num_prompt_tokens=computed)
    return manager.get_block_ids_for_computed_tokens("r", computed)


def _decode_table(config: KVCacheConfig, external: int) -> tuple[list[int], ...]:
    """The decode's table after allocating ``external`` tokens for an asynchronous load."""
    manager = KVCacheManager(config, MAX_LEN, BS, hash_block_size=BS, enable_caching=True)
    request = _request(external + 1)
    blocks = manager.allocate_slots(
        request, 0, num_external_computed_tokens=external, delay_cache_blocks=True
    )
    assert blocks is not None
    return manager.get_blocks("r").get_block_ids()


def _read_pairs(
    prefill: tuple[list[int], ...], decode: tuple[list[int], ...], prompt: int, backoff: int
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """The (decode, prefill) block pairs of the READ order the consumer book emits, and the
    tokens it loads."""
    book = ConsumerBook(TransferMode.READ, BS, prefill_backoff=backoff)
    params = read_params(prefill)
    match = book.match("r", params, prompt, 0)
    assert book.on_allocated("r", params, decode, match.num_tokens)
    (order,) = book.take_orders().reads
    return order.local_block_ids, order.remote_block_ids, match.num_tokens


def _move(
    decode: tuple[torch.Tensor, dict[str, torch.Tensor]],
    prefill: tuple[torch.Tensor, dict[str, torch.Tensor]],
    groups_d: list[KVCacheGroupSpec],
    groups_p: list[KVCacheGroupSpec],
    local_ids: Sequence[int],
    remote_ids: Sequence[int],
    one_launch: bool = False,
) -> None:
    """Plan every registered tensor as the worker does and copy the planned bytes: one
    copy per descriptor, or (``one_launch``) every tensor's plan as one batch of the
    device copier over the whole buffer."""
    (d_buf, d_caches), (p_buf, p_caches) = decode, prefill
    d_layers = resolve_layers(d_caches, _config(groups_d, DECODE_BLOCKS), {})
    p_layers = {x.tensor.name: x for x in resolve_layers(p_caches, _config(groups_p, 1), {})}
    got, src = d_buf.numpy(), p_buf.numpy()
    batch = []
    for layer in d_layers:
        remote = p_layers[layer.tensor.name]
        plan = plan_transfer(
            layer.geometry,
            local_ids,
            remote_ids,
            remote.geometry.num_blocks,
            remote.geometry.block_stride_bytes,
        )
        d_base = layer.tensor.addr - d_buf.data_ptr()
        p_base = remote.tensor.addr - p_buf.data_ptr()
        batch.append((plan.local_offsets + d_base, plan.remote_offsets + p_base, plan.sizes))
        for lo, ro, size in zip(*plan.to_lists(), strict=True):
            if not one_launch:
                got[d_base + lo : d_base + lo + size] = src[p_base + ro : p_base + ro + size]
    if one_launch:
        copier = DeviceCopier(torch.device("cpu"), memcpy_descriptors=0)
        whole = [np.concatenate(side) for side in zip(*batch, strict=True)]
        assert copier.copy(d_buf, p_buf, *whole).query()
        assert copier.kernels <= 2


def _move_request(
    decode: tuple[torch.Tensor, dict[str, torch.Tensor]],
    prefill: tuple[torch.Tensor, dict[str, torch.Tensor]],
    groups_d: list[KVCacheGroupSpec],
    groups_p: list[KVCacheGroupSpec],
    local_ids: Sequence[int],
    remote_ids: Sequence[int],
) -> None:
    """Plan every registered tensor as one request batch against each side's whole buffer
    and copy the planned bytes."""
    (d_buf, d_caches), (p_buf, p_caches) = decode, prefill
    d_layers = resolve_layers(d_caches, _config(groups_d, DECODE_BLOCKS), {})
    p_layers = {x.tensor.name: x for x in resolve_layers(p_caches, _config(groups_p, 1), {})}
    layers = []
    for layer in d_layers:
        remote = p_layers[layer.tensor.name]
        layers.append(
            RequestLayer(
                layer.tensor.name,
                layer.geometry,
                remote.geometry.num_blocks,
                remote.geometry.block_stride_bytes,
                Placement(0, layer.tensor.addr - d_buf.data_ptr()),
                Placement(0, remote.tensor.addr - p_buf.data_ptr()),
            )
        )
    (batch,) = plan_request(layers, local_ids, remote_ids)
    got, src = d_buf.numpy(), p_buf.numpy()
    for lo, ro, size in zip(*batch.plan.to_lists(), strict=True):
        got[lo : lo + size] = src[ro : ro + size]


def _page(caches: dict[str, torch.Tensor], name: str, block: int) -> bytes:
    return bytes(caches[name][block].contiguous().view(torch.uint8).flatten().numpy())


CASES = {
    "full + sliding window": ((FULL, SLIDING), 0),
    "full + sliding window + state": ((FULL, SLIDING, STATE), 1),
    "full + three linear-attention states": ((FULL, STATE, STATE, STATE), 1),
    "full + chunked local": ((FULL, CHUNKED), 0),
    "MLA + state": ((LATENT, LATENT_STATE), 1),
}


MOVERS: dict[str, Callable[..., None]] = {
    "per layer": partial(_move, one_launch=False),
    "one launch": partial(_move, one_launch=True),
    "request batch": _move_request,
}


@pytest.mark.parametrize("mover", list(MOVERS))
@pytest.mark.parametrize("prompt", [200, 192, 65])
@pytest.mark.parametrize("case", list(CASES))
def test_every_block_the_decode_keeps_holds_the_prefills_bytes(
    case: str, prompt: int, mover: str
) -> None:
    """``one launch``: the request's every group and layer as one device copier batch;
    ``request batch``: every tensor planned as one batch against each side's whole buffer."""
    specs, backoff = CASES[case]
    groups_p, groups_d = _groups(*specs), _groups(*specs)
    config_p = _config(groups_p, PREFILL_BLOCKS)
    config_d = _config(groups_d, DECODE_BLOCKS)
    assert has_state_groups(config_d) is bool(backoff)
    check_transferable(config_d)
    prefill, decode = _caches(config_p, 1), _caches(config_d, 2)
    untouched = decode[0].clone()
    computed = prompt - backoff  # a prefill with recurrent state stops one token short
    table_p = _prefill_table(config_p, computed)
    local, remote, loaded = _read_pairs(table_p, _decode_table(config_d, computed), prompt, backoff)
    assert loaded == computed
    table_d = _decode_table(config_d, loaded)
    MOVERS[mover](decode, prefill, groups_d, groups_p, local, remote)
    kept = 0
    for group_p, group_d, ids_p, ids_d in zip(groups_p, groups_d, table_p, table_d, strict=True):
        for position, (bp, bd) in enumerate(zip(ids_p, ids_d, strict=False)):
            if bd == 0:
                continue  # the decode keeps no KV here
            assert bp != 0, f"{case}: the decode needs position {position} the prefill freed"
            kept += 1
            for name_p, name_d in zip(group_p.layer_names, group_d.layer_names, strict=True):
                assert _page(decode[1], name_d, bd) == _page(prefill[1], name_p, bp), (
                    f"{case}: {name_d} block {bd} differs from the prefill's {bp}"
                )
    assert kept == len(local)
    assert not torch.equal(decode[0], untouched)


def test_a_tensor_is_registered_once_under_the_last_layer_that_writes_it() -> None:
    groups = _groups(FULL, SLIDING, STATE)
    config = _config(groups, DECODE_BLOCKS)
    _, caches = _caches(config, 3)
    layers = resolve_layers(caches, config, {})
    # slot 0 holds layers 0 (full), 1 (sliding), 2 (state); slot 1 holds 3, 4, 5
    assert [layer.tensor.name for layer in layers] == ["model.layers.2.attn", "model.layers.5.attn"]
    assert all(layer.geometry.block_len == PAGE for layer in layers)
    assert all(layer.facts.spec == "FullAttentionSpec" for layer in layers)


def test_a_tensor_holding_only_state_is_refused_by_name() -> None:
    groups = _groups(STATE)
    config = _config(groups, DECODE_BLOCKS)
    _, caches = _caches(config, 4)
    with pytest.raises(ValueError, match=r"share a tensor without an attention layer.*MambaSpec"):
        resolve_layers(caches, config, {})


def test_the_fingerprint_names_each_groups_window_and_state() -> None:
    config = _config(_groups(FULL, SLIDING, STATE), DECODE_BLOCKS)
    full, sliding, state = group_structure(config)
    assert full == "FullAttentionSpec:2"
    assert sliding == f"SlidingWindowSpec:2:window={WINDOW}"
    assert state.startswith("MambaSpec:2:state=[[96, 3], [2, 16, 16]]/bfloat16,float32/")
    assert state.endswith(f"/{PAGE}")
    wider = replace(SLIDING, sliding_window=128)
    other = _config(_groups(FULL, wider), DECODE_BLOCKS)
    assert group_structure(other)[1] != sliding


def test_layerwise_loads_are_refused_for_a_hybrid_model() -> None:
    hybrid = _config(_groups(FULL, SLIDING), DECODE_BLOCKS)
    layerwise = parse_settings({"transport": "nixl", "read_mode": True, "load_mode": "layerwise"})
    with pytest.raises(ValueError, match=r"layerwise with a hybrid model \(2 KV-cache groups"):
        check_hybrid_settings(layerwise, hybrid)
    check_hybrid_settings(parse_settings({"transport": "nixl"}), hybrid)
    check_hybrid_settings(layerwise, _config(_groups(FULL), DECODE_BLOCKS))


def test_a_state_larger_than_the_attention_page_is_refused_by_name() -> None:
    big = replace(STATE, shapes=((96, 3), (2, 32, 32)), page_size_padded=None)  # 8,768 bytes
    small = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    groups = _groups(small, replace(big, block_size=16))
    config = _config(groups, DECODE_BLOCKS)
    layers = len(groups[0].layer_names)
    page = big.page_size_bytes  # each tensor as large as the state page: the views fit
    config.kv_cache_tensors = [
        KVCacheTensor(page * DECODE_BLOCKS * layers, g.layer_names, page * DECODE_BLOCKS, page)
        for g in groups
    ]
    _, caches = _caches(config, 5)
    with pytest.raises(ValueError, match=r"state does not fit the 4096-byte page"):
        resolve_layers(caches, config, {})
