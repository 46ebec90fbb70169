"""What the connector supports of vLLM's configuration, decided at start-up and per forward.

* Pipeline parallelism: supported. Every stage has its own ports and engine name, and stage
  ``s`` of a consumer pairs with stage ``s`` of its producer (both sides need the same
  pipeline split; the handshake refuses a peer with another one).
* Decode and prefill context parallelism: refused. A context-parallel rank holds every
  ``cp``-th token of a block, which block-granular transfers cannot scatter.
* ``kv_buffer_device``: the KV cache is registered where vLLM allocates it; a value other
  than the platform's device (host staging on a GPU, another device) is refused.
* ``--enable-return-routed-experts``: refused. vLLM's routed-experts output caps a
  connector's cache hits to what its own cache holds, block-aligned: moriio's loads would be
  dropped and every decode would recompute its prompt.
* ``--enable-sleep-mode``: supported over NIXL on a vLLM that calls the connector's sleep
  hooks (0.33); refused with mori and on vLLM 0.32, naming why
  (:func:`~moriio.vllm_plugin.vllm_facts.sleep_mode_refusal`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moriio.config.settings import ConnectorSettings
from moriio.domain.values.modes import LoadMode
from moriio.log import get_logger
from moriio.vllm_plugin.kv_views import num_transfer_groups
from moriio.vllm_plugin.vllm_facts import returns_routed_experts, sleep_mode_refusal

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

log = get_logger("moriio.vllm")


class UnsupportedConfigError(ValueError):
    """The vLLM configuration asks for something the connector does not do."""


def check_supported(
    vllm_config: VllmConfig,
    platform_device: str | None = None,
    settings: ConnectorSettings | None = None,
) -> None:
    """Raise :class:`UnsupportedConfigError` naming what is unsupported and what to do."""
    if returns_routed_experts(vllm_config):
        raise UnsupportedConfigError(
            "moriio does not support --enable-return-routed-experts: vLLM's routed-experts "
            "output caps a KV connector's cache hits to what its own cache holds, "
            "block-aligned, so moriio's loads would be dropped and every decode would "
            "recompute its prompt. Run without --enable-return-routed-experts."
        )
    model = getattr(vllm_config, "model_config", None)
    if settings is not None and getattr(model, "enable_sleep_mode", False):
        refusal = sleep_mode_refusal(settings)
        if refusal is not None:
            raise UnsupportedConfigError(f"moriio cannot follow sleep mode here: {refusal}")
    parallel = vllm_config.parallel_config
    for key in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        size = int(getattr(parallel, key, 1) or 1)
        if size > 1:
            raise UnsupportedConfigError(
                f"moriio does not support context parallelism: {key}={size}. A context-"
                "parallel rank holds every n-th token of a block, which moriio's block "
                f"transfers cannot scatter; run both engines with {key}=1."
            )
    kv_config = vllm_config.kv_transfer_config
    wanted = None if kv_config is None else kv_config.kv_buffer_device
    platform = _platform_device() if platform_device is None else platform_device
    if not wanted or not platform or wanted == platform:
        return
    if wanted == "cpu":
        raise UnsupportedConfigError(
            f"moriio does not support kv_buffer_device='cpu' on a {platform} platform: it "
            "registers the KV cache where vLLM allocates it (no host staging). Remove "
            f"kv_buffer_device or set it to {platform!r}."
        )
    raise UnsupportedConfigError(
        f"kv_buffer_device={wanted!r} does not match this {platform} platform: moriio "
        f"registers the KV cache in place. Remove kv_buffer_device or set it to {platform!r}."
    )


def _platform_device() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type or "")


def forward_is_full_graph() -> bool:
    """Whether the forward running now replays a FULL CUDA graph (vLLM decides per batch:
    with FULL_AND_PIECEWISE, mixed and prefill batches run piecewise or eager)."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return False
    return bool(get_forward_context().cudagraph_runtime_mode == CUDAGraphMode.FULL)


def check_hybrid_settings(settings: ConnectorSettings, kv_cache_config: KVCacheConfig) -> None:
    """Refuse settings a hybrid model (several transferred KV-cache groups) cannot run:
    layerwise loads gate attention layer by layer, but a hybrid model's layers share their
    KV tensors across groups, so a layer may read a tensor before its gate opened."""
    groups = num_transfer_groups(kv_cache_config)
    if groups > 1 and settings.load_mode is LoadMode.LAYERWISE:
        raise ValueError(
            f"load_mode layerwise with a hybrid model ({groups} KV-cache groups to transfer): "
            "its layers share KV tensors across groups, which layerwise gates cannot order; "
            'use "load_mode": "async" (the default)'
        )


def full_cudagraphs(vllm_config: VllmConfig) -> bool:
    """Whether some batches may replay FULL CUDA graphs (the mode of each forward is read
    when it runs: see :func:`forward_is_full_graph`)."""
    mode = vllm_config.compilation_config.cudagraph_mode
    return (
        mode is not None
        and mode.has_full_cudagraphs()
        and not vllm_config.model_config.enforce_eager
    )
