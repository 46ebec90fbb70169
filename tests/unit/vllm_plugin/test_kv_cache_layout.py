"""``kv_cache_layout``: the page order the connector asks of vLLM, kept by vLLM's own
resolution where every backend supports it, and dropped (the backends' choice) where not."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, VllmConfig
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

from moriio.config.settings import SettingsError, parse_settings
from moriio.vllm_plugin import MoriioKVConnector

pytestmark = pytest.mark.vllm

EVERY_ORDER = ["LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC"]


def _config(extra: dict[str, Any]) -> VllmConfig:
    return VllmConfig(
        cache_config=CacheConfig(block_size=16),
        kv_transfer_config=KVTransferConfig(
            kv_connector="MoriioKVConnector",
            kv_connector_module_path="moriio.vllm_plugin",
            kv_role="kv_both",
            kv_connector_extra_config={"transport": "nixl", **extra},
        ),
        device_config=DeviceConfig("cpu"),
    )


def test_the_connector_asks_for_the_named_page_order_and_nothing_by_default() -> None:
    assert MoriioKVConnector.get_required_kvcache_layout(_config({})) is None
    for name in ("blnhc", "BLHNC", " BhLnC "):
        config = _config({"kv_cache_layout": name})
        assert MoriioKVConnector.get_required_kvcache_layout(config) == name.strip().upper()
    with pytest.raises(SettingsError, match="kv_cache_layout must be one of engine, lbnhc"):
        parse_settings({"kv_cache_layout": "HND"})


def test_vllm_keeps_a_block_outer_order_every_backend_supports_and_drops_it_otherwise() -> None:
    outer = {"kv_cache_layout": "blnhc"}
    assert resolve_kv_cache_layout(_config(outer), [EVERY_ORDER]).name == "BLNHC"
    # vLLM's CPU attention supports LBHNC only: the request is dropped, with a warning.
    assert resolve_kv_cache_layout(_config(outer), [["LBHNC"]]).name == "LBHNC"
    assert resolve_kv_cache_layout(_config({}), [EVERY_ORDER]).name == "LBNHC"
