"""``vllm.general_plugins`` entry point: registers the connector under the name ``moriio``."""

from __future__ import annotations

CONNECTOR_NAME = "moriio"


def register() -> None:
    """Idempotent: a second call (vLLM loads plugins in every process) does nothing."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if CONNECTOR_NAME in KVConnectorFactory._registry:
        return
    KVConnectorFactory.register_connector(
        CONNECTOR_NAME, "moriio.vllm_plugin.connector", "MoriioKVConnector"
    )
