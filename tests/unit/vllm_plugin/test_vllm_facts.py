"""What differs between vLLM 0.32 and 0.33, read in one place: the ROCm V layout, the shuffle
setting and the KV quant mode in the handshake fingerprint (a pair differing in one is refused
by name), routed-experts return and sleep mode refused at start-up with the reason."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.attention.backends.rocm_attn import RocmAttentionImpl
from vllm.v1.kv_cache_interface import KVQuantMode

from moriio.config.settings import ConnectorSettings, Transport
from moriio.domain.protocol.fingerprint import Fingerprint, IncompatiblePeerError
from moriio.vllm_plugin.fingerprint import engine_fingerprint
from moriio.vllm_plugin.kv_views import layer_backends, resolve_layers
from moriio.vllm_plugin.support import UnsupportedConfigError, check_supported
from moriio.vllm_plugin.vllm_facts import (
    quant_mode_name,
    sleep_mode_refusal,
    tells_connector_of_sleep,
    value_layout,
)
from moriio_tools.vllm_harness import BLOCK_SIZE, make_kv_cache_config
from support.vllm_scheduler import make_vllm_config

LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
ON_033 = vllm.__version__.startswith("0.33")


class _Backend:
    @staticmethod
    def get_name() -> str:
        return "ROCM_ATTN"


class _RocmLayer(AttentionLayerBase):
    """An attention layer as the compiled model holds it: its ROCm impl, after the fused
    QK-norm + RoPE + KV-cache pass ran (or not)."""

    def __init__(self, interleaved: bool) -> None:
        super().__init__()
        self.impl = object.__new__(RocmAttentionImpl)
        self.impl._use_interleaved_v_cache = False
        if interleaved:
            if hasattr(RocmAttentionImpl, "set_interleaved_v_cache"):
                self.impl.set_interleaved_v_cache()  # vLLM 0.33's own switch
            else:
                self.impl._use_interleaved_v_cache = True

    def get_attn_backend(self) -> Any:
        return _Backend

    def get_kv_cache_spec(self, vllm_config: Any) -> None:
        return None


def _fingerprint(*, interleaved: bool = False) -> Fingerprint:
    config = make_vllm_config("kv_producer", {"read_mode": True})
    context = config.compilation_config.static_forward_context
    for name in LAYERS:
        context[name] = _RocmLayer(interleaved)
    kv_cache_config = make_kv_cache_config(8)
    kv = {name: torch.zeros((2, 8, BLOCK_SIZE, 1, 1)) for name in LAYERS}
    backends = layer_backends(config, list(kv))
    layers = resolve_layers(kv, kv_cache_config, backends)
    return engine_fingerprint(ConnectorSettings(), config, kv_cache_config, layers)


def _refusal(ours: Fingerprint, theirs: Fingerprint) -> str:
    with pytest.raises(IncompatiblePeerError) as exc:
        ours.check_compatible(theirs)
    return str(exc.value)


def test_the_interleaved_v_layout_is_in_the_fingerprint_and_refused_by_name() -> None:
    standard, interleaved = _fingerprint(), _fingerprint(interleaved=True)
    assert standard.value_layout == "shuffle=off;v=standard"
    assert interleaved.value_layout == "shuffle=off;v=interleaved"
    assert _refusal(standard, interleaved) == (
        "incompatible peer: value_layout differs (ours='shuffle=off;v=standard', "
        "theirs='shuffle=off;v=interleaved')"
    )


def test_engines_on_different_vllm_releases_are_refused_by_name() -> None:
    from dataclasses import replace

    ours = _fingerprint()
    theirs = replace(ours, vllm_version="0.32.0" if ON_033 else "0.33.0")
    assert f"vllm_version differs (ours='{vllm.__version__}', theirs='{theirs.vllm_version}')" in (
        _refusal(ours, theirs)
    )


def test_the_rocm_shuffle_setting_is_in_the_fingerprint_and_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    off = _fingerprint()
    monkeypatch.setenv("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT", "1")
    on = _fingerprint()
    assert on.value_layout == "shuffle=on;v=standard"
    assert "value_layout differs (ours='shuffle=off;v=standard', theirs='shuffle=on;" in (
        _refusal(off, on)
    )


def test_the_interleaved_switch_is_the_one_rocm_attention_sets() -> None:
    """Pinned to vLLM's source: 0.33's fused write calls ``set_interleaved_v_cache``, which
    sets the attribute the fingerprint reads; 0.32 has neither (V is never interleaved)."""
    impl = object.__new__(RocmAttentionImpl)
    assert hasattr(RocmAttentionImpl, "set_interleaved_v_cache") == ON_033
    if ON_033:
        impl.set_interleaved_v_cache()
        assert impl._use_interleaved_v_cache is True


def test_a_quant_mode_is_named_by_its_value_with_every_alias() -> None:
    assert quant_mode_name(KVQuantMode.NONE) == "0=NONE"
    assert quant_mode_name(KVQuantMode.FP8_PER_TENSOR) == "1=FP8_PER_TENSOR"
    if ON_033:
        custom = KVQuantMode["CUSTOM"]  # an alias of OCTAVE_K3V4 in 0.33
        assert custom is KVQuantMode["OCTAVE_K3V4"]
        assert quant_mode_name(custom) == "12=OCTAVE_K3V4|CUSTOM"
        assert quant_mode_name(KVQuantMode["OCTAVE_K3V3"]) == "13=OCTAVE_K3V3"


def test_engines_differing_only_in_the_quant_mode_are_refused_by_name() -> None:
    ours = _fingerprint()
    other_mode = KVQuantMode["OCTAVE_K3V3"] if ON_033 else KVQuantMode.FP8_PER_TENSOR
    theirs_layers = tuple(
        _replace_quant(layer, quant_mode_name(other_mode)) for layer in ours.layers
    )
    theirs = _with_layers(ours, theirs_layers)
    text = _refusal(ours, theirs)
    assert f"layers[0].quant differs (ours='0=NONE', theirs='{quant_mode_name(other_mode)}')" in (
        text
    )


def _replace_quant(layer: Any, quant: str) -> Any:
    from dataclasses import replace

    return replace(layer, quant=quant)


def _with_layers(fp: Fingerprint, layers: tuple[Any, ...]) -> Fingerprint:
    from dataclasses import replace

    return replace(fp, layers=layers)


def test_value_layout_reads_the_default_where_vllm_knows_no_layers() -> None:
    config = make_vllm_config("kv_producer", {"read_mode": True})
    assert value_layout(config, LAYERS) == "shuffle=off;v=standard"


def test_routed_experts_return_is_refused_at_start_up_with_the_reason() -> None:
    config = make_vllm_config("kv_producer", {"read_mode": True})
    check_supported(config)
    config.aux_output_config.enable_return_routed_experts = True
    with pytest.raises(UnsupportedConfigError, match="--enable-return-routed-experts") as exc:
        check_supported(config)
    assert "recompute" in str(exc.value)


def test_vllm_0_33_tells_the_connector_of_sleep_and_0_32_does_not() -> None:
    assert hasattr(KVConnectorBase_V1, "restore_kv_caches") == ON_033
    assert tells_connector_of_sleep() == ON_033


@pytest.mark.parametrize("transport", [Transport.NIXL, Transport.MORI])
def test_sleep_mode_is_refused_at_start_up_where_it_cannot_be_followed(
    transport: Transport,
) -> None:
    config = make_vllm_config("kv_producer", {"read_mode": True})
    config.model_config.enable_sleep_mode = True
    settings = ConnectorSettings(transport=transport)
    refusal = sleep_mode_refusal(settings)
    if ON_033 and transport is Transport.NIXL:
        assert refusal is None
        check_supported(config, settings=settings)
        return
    assert refusal is not None
    expected = "vLLM 0.33" if not ON_033 else "mori keeps each peer's remote memory keys"
    assert expected in refusal
    with pytest.raises(UnsupportedConfigError, match="cannot follow sleep mode here"):
        check_supported(config, settings=settings)


def test_supports_sleep_mode_names_the_transport_s_reason(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from moriio.vllm_plugin.connector import MoriioKVConnector

    config = make_vllm_config("kv_producer", {"read_mode": True, "transport": "nixl"})
    kv_config = config.kv_transfer_config
    assert kv_config is not None
    assert MoriioKVConnector.supports_sleep_mode(kv_config) == ON_033
    monkeypatch.setitem(sys.modules, "mori", object())  # as on a ROCm host with mori
    kv_config.kv_connector_extra_config = {"read_mode": True, "transport": "mori"}
    with caplog.at_level("ERROR"):
        assert MoriioKVConnector.supports_sleep_mode(kv_config) is False
    assert "sleep mode refused" in caplog.text
    reason = "remote memory keys for the life of its engine" if ON_033 else "vLLM 0.33"
    assert reason in caplog.text
