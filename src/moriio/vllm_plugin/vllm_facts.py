"""What differs between the vLLM releases the connector supports (0.32 and 0.33), in one place.

Every fact is read from vLLM's own configuration, backend objects or environment, with the
value a release implies where it lacks the attribute; nothing else in the connector asks which
release it runs on. The hooks 0.33 added (sleep mode's ``supports_sleep_mode``,
``unregister_kv_caches``, ``restore_kv_caches``) need no version check: the connector defines
them and 0.32 never calls them; but 0.32 releases the KV memory of an engine started with
``--enable-sleep-mode`` without calling them, so whether it does is read here. Model Runner
V2's order (transfer results before the save is awaited, the drafter's save after them, the
wait in ``finalize_step``) needs nothing: results never seal a forward's saves.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING

from moriio.config.settings import ConnectorSettings, Transport

if TYPE_CHECKING:
    from vllm.config import VllmConfig

SHUFFLE_ENV = "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"

MORI_SLEEP_REFUSAL = (
    "mori keeps each peer's remote memory keys for the life of its engine "
    "(deregister_remote_engine forgets only the control-plane entry) and its XGMI path maps "
    "the KV cache through IPC handles: after a wake neither can be shown to leave the released "
    'memory alone. Run without --enable-sleep-mode, or with "transport": "nixl"'
)


def quant_mode_name(mode: object) -> str:
    """A KV quantisation mode named by its value, with every name vLLM gives that value:
    ``"12=OCTAVE_K3V4|CUSTOM"`` (0.33 makes ``CUSTOM`` an alias of ``OCTAVE_K3V4``, and an
    enum member's ``.name`` would show only the first name)."""
    if not isinstance(mode, enum.Enum):
        return str(mode)
    value = mode.value
    names = [name for name, member in type(mode).__members__.items() if member is mode]
    return f"{value}={'|'.join(names)}"


def shuffle_kv_layout() -> bool:
    """``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT`` as vLLM reads it (False where it is unknown)."""
    from vllm import envs

    try:
        return bool(getattr(envs, SHUFFLE_ENV))
    except AttributeError:
        return False


def interleaved_v_layers(vllm_config: VllmConfig, names: Sequence[str]) -> int:
    """How many of the attention layers ``names`` write V interleaved: ROCm attention does
    when AITER's fused QK-norm + RoPE + KV-cache write serves the layer
    (``impl._use_interleaved_v_cache``, set while the model is compiled; absent: not
    interleaved)."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase, list(names))  # type: ignore[type-abstract]
    return sum(
        bool(getattr(getattr(layer, "impl", None), "_use_interleaved_v_cache", False))
        for layer in layers.values()
    )


def value_layout(vllm_config: VllmConfig, names: Sequence[str]) -> str:
    """How V sits in a page beyond what its shape, strides and backend name say:
    ``shuffle=on|off`` and ``v=standard``, ``v=interleaved`` or ``v=interleaved:k/n``."""
    interleaved = interleaved_v_layers(vllm_config, names)
    if interleaved == 0:
        v_layout = "standard"
    elif interleaved == len(names):
        v_layout = "interleaved"
    else:
        v_layout = f"interleaved:{interleaved}/{len(names)}"
    return f"shuffle={'on' if shuffle_kv_layout() else 'off'};v={v_layout}"


def returns_routed_experts(vllm_config: VllmConfig) -> bool:
    """Whether ``--enable-return-routed-experts`` is set (False where vLLM lacks it)."""
    aux = getattr(vllm_config, "aux_output_config", None)
    return bool(getattr(aux, "enable_return_routed_experts", False))


def tells_connector_of_sleep() -> bool:
    """Whether this vLLM calls a connector's ``unregister_kv_caches`` before sleep mode
    releases the KV memory and ``restore_kv_caches`` after a wake (0.33 on; 0.32 does not)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    return hasattr(KVConnectorBase_V1, "restore_kv_caches")


def sleep_mode_refusal(settings: ConnectorSettings) -> str | None:
    """Why sleep mode cannot be followed safely here; None when it can."""
    if not tells_connector_of_sleep():
        return (
            "this vLLM does not tell a KV connector about sleep mode (no unregister_kv_caches "
            "/ restore_kv_caches hooks, added in vLLM 0.33): the connector's registrations and "
            "its peers' would outlive the released KV memory. Use vLLM 0.33, or run without "
            "--enable-sleep-mode"
        )
    if settings.transport is Transport.MORI:
        return MORI_SLEEP_REFUSAL
    return None
