"""vLLM plugin.

Select with ``kv_connector="MoriioKVConnector"``, ``kv_connector_module_path="moriio.vllm_plugin"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moriio.vllm_plugin.connector import MoriioKVConnector


def __getattr__(name: str) -> Any:
    """The connector class, imported on first use: the package stays importable where
    vLLM is not installed."""
    if name == "MoriioKVConnector":
        from moriio.vllm_plugin.connector import MoriioKVConnector

        return MoriioKVConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MoriioKVConnector"]
