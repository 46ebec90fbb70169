"""Connections of the mori adapter: peers, their imported regions, sessions and lanes.

A lane is one mori ``IOEngine``; a connection that broke (its queue pairs went to ERROR)
moves the peer to the next lane. Sessions are per (lane, local memory, peer, remote memory),
where a memory is one mori registration (a whole shared allocation, or a region registered
alone), and are built outside the adapter lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moriio.adapters.mori.lanes import MAX_LANES, Backend, EngineSpec, Lane, build_engine
from moriio.log import get_logger
from moriio.ports import LocalRegion, MemoryKind, PeerId, RemoteRegion, TransferEngineError

_log = get_logger("moriio.adapters.mori.engine")
SessionKey = tuple[int, int, PeerId, int]  # (lane, local memory, peer, remote memory)
SharedKey = tuple[int, int, MemoryKind, int]  # allocation address, length, kind, device
_RETRY_FIRST, _RETRY_MAX = 0.5, 30.0  # back-off after a failed connection attempt (s)


@dataclass(slots=True, eq=False)
class Memory:
    """One registration with mori: a whole allocation, or a region registered alone."""

    mem_id: int  # the lane 0 MemoryDesc id
    addr: int
    length: int
    kind: MemoryKind
    device_id: int
    desc: Any  # lane 0 MemoryDesc
    shared: SharedKey | None = None  # set for an allocation regions are views of
    regions: set[int] = field(default_factory=set)  # live regions lying in it


@dataclass(frozen=True, slots=True)
class Local:
    region: LocalRegion
    memory: Memory
    base: int  # byte offset of the region inside its memory


@dataclass(frozen=True, slots=True)
class Remote:
    region: RemoteRegion
    desc: Any  # the peer's MemoryDesc of the memory the region lies in
    base: int  # byte offset of the region inside that memory


@dataclass(slots=True)
class Peer:
    desc: Any  # EngineDesc
    metadata: bytes
    retry_at: float = 0.0
    backoff: float = 0.0
    last_error: str = ""


class Connections:
    """The connection half of :class:`~moriio.adapters.mori.MoriTransferEngine`."""

    backend: Backend
    _io: Any
    _key: str
    _spec: EngineSpec
    _clock: Callable[[], float]
    _lanes: dict[int, Lane]
    _lock: threading.RLock
    _lane_lock: threading.Lock
    _regions: dict[int, Local]
    _memories: dict[int, Memory]  # live registrations by memory id
    _peers: dict[PeerId, Peer]
    _generation: dict[PeerId, int]  # lane per peer; survives remove_peer
    _imported: dict[tuple[PeerId, int], Remote]
    _remote_mems: dict[tuple[PeerId, int], Any]  # (peer, memory id) -> its MemoryDesc
    _sessions: dict[SessionKey, Any]
    _closed: bool

    def _check_open(self) -> None:
        if self._closed:
            raise TransferEngineError(f"engine {self._key!r} is closed")

    def _register_on(
        self, lane: Lane, addr: int, length: int, kind: MemoryKind, device_id: int
    ) -> Any:
        loc = self._io.MemoryLocationType
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

    def _missing_sessions(self, lane: int, peer: PeerId, remote_mem: int) -> list[SessionKey]:
        """Sessions from every local memory to one remote memory not built yet on ``lane``."""
        keys = [(lane, mem_id, peer, remote_mem) for mem_id in self._memories]
        return [key for key in keys if key not in self._sessions]

    def _refusal(self, peer: PeerId, lane: int, now: float) -> str:
        """Why a post to ``peer`` fails without reaching mori; empty when it may go ahead."""
        if lane >= MAX_LANES:
            return (
                f"the connection to {peer} broke {MAX_LANES} times; remove the peer and "
                "handshake again once it is healthy"
            )
        known = self._peers[peer]
        if now < known.retry_at:
            return (
                f"no connection to {peer} ({known.last_error}); next attempt in "
                f"{known.retry_at - now:.1f} s"
            )
        return ""

    def _connect(self, key: SessionKey) -> Any | None:
        """The session for ``key``, built outside the adapter lock; TransferEngineError with
        mori's reason when it cannot be built. None when no backend routes the pair."""
        lane_index, mem_id, peer, remote_mem = key
        lane = self._lane(lane_index)
        with self._lock:
            self._check_open()
            memory, remote = self._memories.get(mem_id), self._remote_mems.get((peer, remote_mem))
            known = self._peers.get(peer)
            if memory is None or remote is None or known is None:
                raise TransferEngineError(f"peer {peer} or its region went away while connecting")
            local_desc = lane.locals.get(mem_id)
            if local_desc is None:
                local_desc = self._register_on(
                    lane, memory.addr, memory.length, memory.kind, memory.device_id
                )
                lane.locals[mem_id] = local_desc
            if peer not in lane.peers:
                lane.engine.register_remote_engine(known.desc)  # control-plane entry only
                lane.peers[peer] = known.desc
        try:
            session = lane.engine.create_session(local_desc, remote)
        except Exception as exc:  # RuntimeError from TCP, QP exchange or region query
            with self._lock:
                self._connect_failed(peer, f"{type(exc).__name__}: {exc}")
            raise TransferEngineError(
                f"mori cannot connect lane {lane.key!r} to {peer}: {type(exc).__name__}: {exc}"
            ) from exc
        with self._lock:
            if session is not None and self._generation.get(peer, 0) == lane_index:
                still = self._memories.get(mem_id) is memory and remote is self._remote_mems.get(
                    (peer, remote_mem)
                )
                if still and not self._closed:
                    self._sessions[key] = session
            if (known := self._peers.get(peer)) is not None:
                known.backoff, known.retry_at = 0.0, 0.0
        return session

    def _connect_failed(self, peer: PeerId, reason: str) -> None:
        known = self._peers.get(peer)
        if known is not None:
            known.backoff = min(max(2 * known.backoff, _RETRY_FIRST), _RETRY_MAX)
            known.retry_at = self._clock() + known.backoff
            known.last_error = reason

    def _lane(self, index: int) -> Lane:
        with self._lock:
            self._check_open()
            lane = self._lanes.get(index)
        if lane is not None:
            return lane
        with self._lane_lock:
            with self._lock:
                self._check_open()
                lane = self._lanes.get(index)
            if lane is not None:
                return lane
            key = f"{self._key}/r{index}"
            engine = build_engine(self._io, key, self._spec, 0)
            _log.warning("mori: new engine rebuilds connections after a broken one", engine=key)
            with self._lock:
                self._check_open()
                return self._lanes.setdefault(index, Lane(index, key, engine))

    def _connection_lost(self, peer: PeerId, lane: int, reason: str) -> None:
        """An error completion left the QPs to ``peer`` in ERROR: rebuild on the next lane."""
        if self._generation.get(peer, 0) != lane:
            return  # already moved on
        self._generation[peer] = lane + 1
        self._drop_sessions(lambda k: k[0] == lane and k[2] == peer)
        _log.warning(
            "mori: connection broke; the next transfer uses a new one",
            peer=peer,
            lane=lane,
            reason=reason,
        )

    def _forget_peer(self, peer: PeerId) -> None:
        self._peers.pop(peer, None)
        self._drop_sessions(lambda k: k[2] == peer)
        for key in [k for k in self._imported if k[0] == peer]:
            del self._imported[key]
        for mem_key in [k for k in self._remote_mems if k[0] == peer]:
            del self._remote_mems[mem_key]
        for lane in self._lanes.values():
            desc = lane.peers.pop(peer, None)
            if desc is not None:  # only the control-plane entry: in-flight work carries on
                lane.engine.deregister_remote_engine(desc)

    def _drop_sessions(self, doomed: Callable[[SessionKey], bool]) -> None:
        for key in [k for k in self._sessions if doomed(k)]:
            del self._sessions[key]
