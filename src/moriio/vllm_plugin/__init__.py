"""vLLM plugin.

Select with ``kv_connector="MoriioKVConnector"``, ``kv_connector_module_path="moriio.vllm_plugin"``.
"""

from moriio.vllm_plugin.connector import MoriioKVConnector

__all__ = ["MoriioKVConnector"]
