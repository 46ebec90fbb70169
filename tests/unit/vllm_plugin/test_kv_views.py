"""Which layers move, from vLLM's cache groups; what is refused at start-up or registration."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SparseCacheRole,
    UniformTypeKVCacheSpecs,
)

from moriio.domain.kv.layout import LayoutKind
from moriio.ports import MemoryKind
from moriio.vllm_plugin.kv_views import check_transferable, resolve_layers, transfer_specs

BLOCKS = 4
ATTN = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
MLA = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
INDEXER = MLAAttentionSpec(
    block_size=16,
    num_kv_heads=1,
    head_size=132,
    dtype=torch.uint8,
    cache_role=SparseCacheRole.INDEXER,
)
MAMBA = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=(torch.bfloat16,))


def _config(*groups: KVCacheGroupSpec) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=list(groups))


def _view(spec: FullAttentionSpec) -> torch.Tensor:
    content = spec.state_content_size_bytes // spec.dtype.itemsize
    return torch.zeros(BLOCKS, spec.num_heads, spec.block_size, content, dtype=spec.dtype)


def test_a_spec_without_layer_views_is_refused_at_start_up_naming_what_is_supported() -> None:
    check_transferable(
        _config(KVCacheGroupSpec(["attn"], ATTN), KVCacheGroupSpec(["mamba"], MAMBA))
    )
    raw = HiSparseResidentSpec(block_size=16, page_size=4096)
    config = _config(KVCacheGroupSpec(["attn"], ATTN), KVCacheGroupSpec(["resident"], raw))
    with pytest.raises(ValueError, match=r"'resident' has a HiSparseResidentSpec.*sliding-window"):
        check_transferable(config)


def test_attention_and_mla_caches_are_accepted_with_per_layer_specs() -> None:
    mixed: KVCacheSpec = UniformTypeKVCacheSpecs(
        block_size=16, kv_cache_specs={"a0": MLA, "idx0": INDEXER, "a1": MLA}
    )
    config = _config(KVCacheGroupSpec(["a0", "idx0", "a1"], mixed))
    check_transferable(config)
    assert transfer_specs(config) == {"a0": MLA, "idx0": INDEXER, "a1": MLA}


def test_layers_vllm_does_not_transfer_and_shared_caches_are_skipped() -> None:
    local_only = KVCacheGroupSpec(["draft"], ATTN, enable_kv_transfer=False)
    config = _config(KVCacheGroupSpec(["l0", "l1"], ATTN), local_only)
    l0, l1, draft = _view(ATTN), _view(ATTN), _view(ATTN)
    caches = {"l0": l0, "l1": l1, "shared": l0, "draft": draft}
    layers = resolve_layers(caches, config, {"l0": "FLASH_ATTN"})
    assert [layer.tensor.name for layer in layers] == ["l0", "l1"]
    assert [layer.backend for layer in layers] == ["FLASH_ATTN", "unknown"]
    assert layers[0].geometry.kind is LayoutKind.PACKED
    facts = layers[0].facts
    assert (facts.spec, facts.heads, facts.content_bytes, facts.page_bytes) == (
        "FullAttentionSpec",
        2,
        256,
        ATTN.page_size_bytes,
    )


def test_a_view_that_does_not_match_its_spec_is_refused_with_backend_spec_shape_and_strides() -> (
    None
):
    config = _config(KVCacheGroupSpec(["l0"], ATTN))
    wrong = torch.zeros(BLOCKS, 16, 2, 128, dtype=torch.bfloat16)  # heads and tokens swapped
    with pytest.raises(ValueError, match="moriio cannot move KV cache layer") as caught:
        resolve_layers({"l0": wrong}, config, {"l0": "FLASH_ATTN"})
    text = str(caught.value)
    for part in ("'l0'", "backend FLASH_ATTN", "FullAttentionSpec(", "(4, 16, 2, 128)", "strides"):
        assert part in text


def test_a_transferred_layer_without_a_cache_tensor_is_refused() -> None:
    config = _config(KVCacheGroupSpec(["l0", "l1"], ATTN))
    with pytest.raises(ValueError, match=r"\['l1'\] have a spec but no cache tensor"):
        resolve_layers({"l0": _view(ATTN)}, config, {})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("PYTORCH_ALLOC_CONF", "max_split_size_mb:128, expandable_segments:True"),
    ],
)
def test_device_kv_from_expandable_segments_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """CUDA IPC cannot export that memory to the peer (UCX's cuda_ipc would not reach it)."""
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    config = _config(KVCacheGroupSpec(["l0"], ATTN))
    device_view = _view(ATTN).to("meta")  # a device tensor without a GPU
    with pytest.raises(ValueError, match=rf"{variable}=.*expandable_segments:True") as caught:
        resolve_layers({"l0": device_view}, config, {})
    assert "cannot be exported" in str(caught.value)
    host = resolve_layers({"l0": _view(ATTN)}, config, {})  # host memory: unaffected
    assert host[0].tensor.kind is MemoryKind.HOST


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
        # torch reads the first of the two that is set
        {"PYTORCH_ALLOC_CONF": "", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    ],
)
def test_device_kv_without_expandable_segments_is_registered(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, str]
) -> None:
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    config = _config(KVCacheGroupSpec(["l0"], ATTN))
    layers = resolve_layers({"l0": _view(ATTN).to("meta")}, config, {})
    assert layers[0].tensor.kind is MemoryKind.DEVICE
