"""mori ``IOEngine`` construction, and lanes: the engines a connection to a peer runs on.

mori keeps queue pairs and remote region keys per remote engine *key* and never prunes them
(``deregister_remote_engine`` only forgets the control-plane entry), and nothing resets a QP
after an error completion or a fatal async event. Lane 0 is the engine peers know (its
descriptors are the ones published); when a connection breaks, transfers to that peer move to
the next lane, a further engine with its own key, so mori has to build fresh QPs. Peers need
not know a lane: the control plane answers any engine that dials it. A lane above 0 that no
peer uses any more, with nothing in flight, is destroyed (its QPs and threads go with it).

:class:`Lanes` holds them all; the engine is closed once its lanes are.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from moriio.adapters.mori.settings import RdmaTuning
from moriio.log import get_logger
from moriio.ports import MemoryKind, PeerId, TransferEngineError

_log = get_logger("moriio.adapters.mori.engine")

Backend = Literal["rdma", "xgmi"]

MAX_LANES = 8
"""mori engines alive at once (each lane is one, with its threads and QPs)."""


def load_mori() -> Any:
    """Import ``mori.io``; ImportError with the reason when mori cannot be loaded here."""
    try:
        importlib.import_module("mori.cpp")
        return importlib.import_module("mori.io")
    except (ImportError, OSError) as exc:
        raise ImportError(
            "mori IO is not importable here "
            f"({type(exc).__name__}: {exc}); it needs the amd-mori package, a ROCm runtime "
            'and an RDMA NIC or AMD GPUs; elsewhere set "transport": "nixl" in '
            "kv_connector_extra_config"
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
                enable_transfer_chunking=tuning.enable_transfer_chunking,
                chunk_bytes=tuning.chunk_bytes,
            )
            config.max_send_wr = tuning.max_send_wr  # a read/write attribute, not a parameter
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


class Lanes:
    """Every lane of one adapter: lane 0 from the start, the next ones built when needed.

    ``lock`` is the adapter lock; a new lane is built outside it (a mori engine starts its
    threads), one at a time. Other methods expect the caller to hold that lock.
    """

    def __init__(
        self, io: Any, key: str, spec: EngineSpec, port: int, lock: threading.RLock
    ) -> None:
        self.io = io
        self.key = key
        self.closed = False  # set by the adapter's close; every call is refused from then on
        self._spec = spec
        self._lock = lock
        self._build_lock = threading.Lock()
        self._lanes = {0: Lane(0, key, build_engine(io, key, spec, port))}
        self._generation = 0  # makes every rebuilt lane's key new

    @property
    def first(self) -> Lane:
        """Lane 0: the engine peers know."""
        return self._lanes[0]

    def check_open(self) -> None:
        if self.closed:
            raise TransferEngineError(f"engine {self.key!r} is closed")

    def get(self, index: int) -> Lane:
        """Lane ``index``, built now (outside the adapter lock) if it is new."""
        with self._lock:
            self.check_open()
            lane = self._lanes.get(index)
        if lane is not None:
            return lane
        with self._build_lock:
            with self._lock:
                self.check_open()
                lane = self._lanes.get(index)
            if lane is not None:
                return lane
            if len(self._lanes) >= MAX_LANES:
                raise TransferEngineError(
                    f"{MAX_LANES} mori engines are alive already (connections that broke and "
                    "whose transfers are not quiet yet); not building another"
                )
            self._generation += 1
            key = f"{self.key}/r{index}.{self._generation}"
            engine = build_engine(self.io, key, self._spec, 0)
            _log.warning("mori: new engine rebuilds connections after a broken one", engine=key)
            with self._lock:
                self.check_open()
                return self._lanes.setdefault(index, Lane(index, key, engine))

    def register_memory(
        self, lane: Lane, addr: int, length: int, kind: MemoryKind, device_id: int
    ) -> Any:
        """Register ``length`` bytes at ``addr`` with ``lane``'s engine; its MemoryDesc."""
        loc = self.io.MemoryLocationType
        try:
            return lane.engine.register_memory(
                ptr=addr,
                size=length,
                device_id=-1 if kind is MemoryKind.HOST else device_id,
                mem_loc=loc.CPU if kind is MemoryKind.HOST else loc.GPU,
            )
        except RuntimeError as exc:  # XGMI registers at once (IPC handles); RDMA only records
            raise TransferEngineError(
                f"mori cannot register {length} bytes at {addr:#x}: {exc}"
            ) from exc

    def deregister_memory(self, mem_id: int) -> None:
        """Hand memory ``mem_id`` back to mori on every lane it was registered with."""
        for lane in self._lanes.values():
            desc = lane.locals.pop(mem_id, None)
            if desc is not None:
                lane.engine.deregister_memory(desc)

    def forget_peer(self, peer: PeerId) -> None:
        """Drop ``peer``'s control-plane entry on every lane; in-flight work carries on."""
        for lane in self._lanes.values():
            desc = lane.peers.pop(peer, None)
            if desc is not None:
                lane.engine.deregister_remote_engine(desc)

    @property
    def indices(self) -> list[int]:
        return list(self._lanes)

    def peers_on(self, index: int) -> list[PeerId]:
        """The peers ``index``'s engine has registered."""
        lane = self._lanes.get(index)
        return [] if lane is None else list(lane.peers)

    def pop_failures(self) -> list[tuple[int, Any]]:
        """Every peer failure mori reported since the last call, by lane (mori 1.2.4's
        ``pop_peer_failure``; older mori reports none)."""
        events: list[tuple[int, Any]] = []
        for index, lane in self._lanes.items():
            pop = getattr(lane.engine, "pop_peer_failure", None)
            while callable(pop) and (event := pop()) is not None:
                events.append((index, event))
        return events

    def retire(self, index: int) -> None:
        """Destroy lane ``index`` (never lane 0): its QPs go, so nothing it posted can land."""
        if index != 0:
            self._lanes.pop(index, None)

    def destroy(self) -> None:
        """Drop the last references to mori's engines: their queue pairs go with them."""
        lanes, self._lanes = self._lanes, {}
        lanes.clear()
