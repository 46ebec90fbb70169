"""Stand-in for ``mori.io``. Like the real module it does not re-export ``TransferStatus``."""

from mori.cpp import (
    BackendType,
    EngineDesc,
    FabricBackendConfig,
    IOEngineConfig,
    MemoryDesc,
    MemoryLocationType,
    PeerFailureEvent,
    PeerFailureReason,
    PollCqMode,
    RdmaBackendConfig,
    StatusCode,
    XgmiBackendConfig,
    set_log_level,
)
from mori.io.engine import IOEngine, IOEngineSession

__all__ = [
    "BackendType",
    "EngineDesc",
    "FabricBackendConfig",
    "IOEngine",
    "IOEngineConfig",
    "IOEngineSession",
    "MemoryDesc",
    "MemoryLocationType",
    "PeerFailureEvent",
    "PeerFailureReason",
    "PollCqMode",
    "RdmaBackendConfig",
    "StatusCode",
    "XgmiBackendConfig",
    "set_log_level",
]
