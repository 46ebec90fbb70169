"""Ports: the Protocols the domain talks through, and the small value types they speak.

This package is the bottom floor of moriio: it imports nothing else from moriio.
"""

from moriio.ports.clock import Clock
from moriio.ports.control_channel import (
    ControlChannel,
    ControlChannelError,
    Inbound,
    MalformedMessageError,
    MessageCodec,
    PeerAddress,
    RequestTimeoutError,
    UntrustedPeerError,
)
from moriio.ports.device_fence import DeviceFence, FenceSource
from moriio.ports.layer_gates import LayerGates
from moriio.ports.segment_copier import CopyDone, SegmentCopier
from moriio.ports.transfer_engine import (
    Allocation,
    LocalRegion,
    MemoryKind,
    PeerId,
    RemoteRegion,
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)

__all__ = [
    "Allocation",
    "Clock",
    "ControlChannel",
    "ControlChannelError",
    "CopyDone",
    "DeviceFence",
    "FenceSource",
    "Inbound",
    "LayerGates",
    "LocalRegion",
    "MalformedMessageError",
    "MemoryKind",
    "MessageCodec",
    "PeerAddress",
    "PeerId",
    "RemoteRegion",
    "RequestTimeoutError",
    "SegmentCopier",
    "TransferEngine",
    "TransferEngineError",
    "TransferHandle",
    "TransferOp",
    "TransferState",
    "TransferStatus",
    "UntrustedPeerError",
]
