"""The ``vllm.general_plugins`` entry point registers the connector as ``moriio``, once."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

pytest.importorskip("vllm")

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from moriio.vllm_plugin import MoriioKVConnector
from moriio.vllm_plugin.registration import CONNECTOR_NAME, register

pytestmark = pytest.mark.vllm


def test_entry_point_is_declared() -> None:
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("moriio") == "moriio.vllm_plugin.registration:register"


def test_register_twice_is_idempotent() -> None:
    register()
    register()  # vLLM loads plugins in every process; a second call must not raise
    assert CONNECTOR_NAME == "moriio"
    config = KVTransferConfig(kv_connector="moriio", kv_role="kv_consumer")
    assert KVConnectorFactory.get_connector_class(config) is MoriioKVConnector


def test_class_name_does_not_collide_with_the_in_tree_connector() -> None:
    assert MoriioKVConnector.__name__ != "MoRIIOConnector"
    register()
    in_tree = KVConnectorFactory.get_connector_class(
        KVTransferConfig(kv_connector="MoRIIOConnector", kv_role="kv_consumer")
    )
    assert in_tree is not MoriioKVConnector


def test_module_path_selection_loads_our_class() -> None:
    config = KVTransferConfig(
        kv_connector="MoriioKVConnector",
        kv_connector_module_path="moriio.vllm_plugin",
        kv_role="kv_producer",
    )
    assert KVConnectorFactory.get_connector_class(config) is MoriioKVConnector
