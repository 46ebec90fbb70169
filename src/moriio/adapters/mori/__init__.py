"""mori IO transfer engine (AMD RDMA / XGMI) and its status classification."""

from moriio.adapters.mori.engine import MoriTransferEngine
from moriio.adapters.mori.lanes import load_mori
from moriio.adapters.mori.status import MoriStatusCode, classify_status

__all__ = ["MoriStatusCode", "MoriTransferEngine", "classify_status", "load_mori"]
