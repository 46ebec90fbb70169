"""mori ``IOEngine`` construction, and lanes: the engines a connection to a peer runs on.

mori keeps queue pairs and remote region keys per remote engine *key* and never prunes them
(``deregister_remote_engine`` only forgets the control-plane entry), and nothing resets a QP
after an error completion. Lane 0 is the engine peers know (its descriptors are the ones
published); when a connection breaks, transfers to that peer move to the next lane, a further
engine with its own key, so mori has to build fresh QPs. Peers need not know a lane: the
control plane answers any engine that dials it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal

from moriio.adapters.mori.settings import RdmaTuning
from moriio.ports import PeerId, TransferEngineError

Backend = Literal["rdma", "xgmi"]

MAX_LANES = 8
"""Connection rebuilds per peer (each costs one more mori engine with its threads)."""


def load_mori() -> Any:
    """Import ``mori.io``; ImportError with the reason when mori cannot be loaded here."""
    try:
        importlib.import_module("mori.cpp")
        return importlib.import_module("mori.io")
    except (ImportError, OSError) as exc:
        raise ImportError(
            "mori IO is not importable here "
            f"({type(exc).__name__}: {exc}); it needs the amd-mori package, a ROCm runtime "
            "and an RDMA NIC or AMD GPUs"
        ) from exc


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """Everything needed to build one more mori engine like the first."""

    host: str
    backend: Backend
    tuning: RdmaTuning
    xgmi_num_streams: int = 64
    xgmi_num_events: int = 64


def build_engine(io: Any, key: str, spec: EngineSpec, port: int) -> Any:
    """A mori ``IOEngine`` with its one backend; TransferEngineError when mori refuses."""
    engine = io.IOEngine(key=key, config=io.IOEngineConfig(host=spec.host, port=port))
    try:
        if spec.backend == "rdma":
            tuning = spec.tuning
            mode = io.PollCqMode.EVENT if tuning.poll_cq_event_mode else io.PollCqMode.POLLING
            config = io.RdmaBackendConfig(
                qp_per_transfer=tuning.qp_per_transfer,
                post_batch_size=tuning.post_batch_size,
                num_worker_threads=tuning.num_worker_threads,
                poll_cq_mode=mode,
                enable_notification=False,
            )
            engine.create_backend(io.BackendType.RDMA, config)
        else:
            config = io.XgmiBackendConfig(
                num_streams=spec.xgmi_num_streams, num_events=spec.xgmi_num_events
            )
            engine.create_backend(io.BackendType.XGMI, config)
    except (RuntimeError, NotImplementedError) as exc:
        hint = (
            " (RDMA needs an active ibverbs port; for AMD GPUs on one node use backend='xgmi')"
            if spec.backend == "rdma"
            else ""
        )
        raise TransferEngineError(
            f"mori cannot create its {spec.backend} backend for {key!r}: {exc}{hint}"
        ) from exc
    return engine


@dataclass(slots=True)
class Lane:
    """One mori engine and what has been registered with it."""

    index: int
    key: str
    engine: Any
    peers: dict[PeerId, Any] = field(default_factory=dict)  # peer -> EngineDesc registered
    locals: dict[int, Any] = field(default_factory=dict)  # memory id -> MemoryDesc on this lane
