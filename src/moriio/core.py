"""The reusable core of moriio, in one import, for connectors other than the vLLM one.

Everything here is engine- and transport-agnostic: plain ints and numpy in, frozen values
out, time passed in as numbers or read from a :class:`Clock`. See docs/reusing-the-core.md.

- Layout: :class:`LayerSpec`, :func:`describe_layout` -> :class:`LayerGeometry`.
- Planning: :func:`plan_transfer` -> :class:`TransferPlan`; :class:`PlanCache` (one plan per
  geometry for a transfer).
- Ledgers: :class:`ReleaseLedger` (producer release fan-in), :class:`ReadLedger` (READ
  consumer), :class:`WriteLedger` (WRITE producer), all ending in :class:`TransferResult`.
- Posting: :class:`Poster` (backpressure retries, deadlines, completion polling) under a
  :class:`TransferPolicy`.
- Ports: :class:`TransferEngine`, :class:`ControlChannel`, :class:`Clock` and their values.
"""

from moriio.domain.kv.layout import LayerGeometry, LayerSpec, LayoutKind, describe_layout
from moriio.domain.kv.plan_cache import PlanCache
from moriio.domain.kv.planner import TransferPlan, plan_transfer
from moriio.domain.ledgers import (
    AckResult,
    Outcome,
    ReadLedger,
    ReleaseLedger,
    TrackResult,
    TransferResult,
    WriteLedger,
)
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.worker.poster import Poster, PostRequest, PostResult
from moriio.ports import (
    Allocation,
    Clock,
    ControlChannel,
    ControlChannelError,
    LocalRegion,
    MemoryKind,
    PeerAddress,
    PeerId,
    RemoteRegion,
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)
from moriio.ports.transfer_engine import Offsets

__all__ = [
    "AckResult",
    "Allocation",
    "Clock",
    "ControlChannel",
    "ControlChannelError",
    "LayerGeometry",
    "LayerSpec",
    "LayoutKind",
    "LocalRegion",
    "MemoryKind",
    "Offsets",
    "Outcome",
    "PeerAddress",
    "PeerId",
    "PlanCache",
    "PostRequest",
    "PostResult",
    "Poster",
    "ReadLedger",
    "ReleaseLedger",
    "RemoteRegion",
    "TrackResult",
    "TransferEngine",
    "TransferEngineError",
    "TransferHandle",
    "TransferOp",
    "TransferPlan",
    "TransferPolicy",
    "TransferResult",
    "TransferState",
    "TransferStatus",
    "WriteLedger",
    "describe_layout",
    "plan_transfer",
]
