"""Connections of the mori adapter: sessions from local memories to peers' memories.

A memory is one mori registration (a whole shared allocation, or a region registered alone).
A session is per (lane, local memory, peer, remote memory) and is built outside the adapter
lock, on the adapter's connection thread (:mod:`~moriio.adapters.mori.connector`): on RDMA
that is a TCP connection and a queue pair exchange. A connection that broke (its queue pairs
went to ERROR, or mori retired them after a fatal NIC event) moves the peer to the next lane,
where sessions are built afresh.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from moriio.adapters.mori.lanes import Lanes
from moriio.adapters.mori.peers import PeerTable
from moriio.adapters.mori.regions import LocalRegions
from moriio.log import get_logger
from moriio.ports import PeerId, TransferEngineError

_log = get_logger("moriio.adapters.mori.engine")
SessionKey = tuple[int, int, PeerId, int]  # (lane, local memory, peer, remote memory)


class Connections:
    """The adapter's sessions, built on demand from its lanes, local regions and peers.

    ``lock`` is the adapter lock: :meth:`connect` takes it itself, every other method expects
    the caller to hold it.
    """

    def __init__(
        self,
        lock: threading.RLock,
        lanes: Lanes,
        local: LocalRegions,
        peers: PeerTable,
        clock: Callable[[], float],
    ) -> None:
        self._lock = lock
        self._lanes = lanes
        self._local = local
        self._peers = peers
        self._clock = clock
        self._sessions: dict[SessionKey, Any] = {}

    def session(self, key: SessionKey) -> Any | None:
        """The session built for ``key``, if any."""
        return self._sessions.get(key)

    def missing(self, lane: int, peer: PeerId, remote_mem: int) -> list[SessionKey]:
        """Sessions from every local memory to one remote memory not built yet on ``lane``."""
        keys = [(lane, mem_id, peer, remote_mem) for mem_id in self._local.memories]
        return [key for key in keys if key not in self._sessions]

    def connect(self, key: SessionKey) -> Any | None:
        """The session for ``key``, built outside the adapter lock; TransferEngineError with
        mori's reason when it cannot be built. None when no backend routes the pair."""
        lane_index, mem_id, peer, remote_mem = key
        lane = self._lanes.get(lane_index)
        with self._lock:
            self._lanes.check_open()
            memory, remote = self._local.memory(mem_id), self._peers.memory(peer, remote_mem)
            known = self._peers.get(peer)
            if memory is None or remote is None or known is None:
                raise TransferEngineError(f"peer {peer} or its region went away while connecting")
            local_desc = lane.locals.get(mem_id)
            if local_desc is None:
                local_desc = self._lanes.register_memory(
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
                self._peers.connect_failed(peer, f"{type(exc).__name__}: {exc}", self._clock())
            raise TransferEngineError(
                f"mori cannot connect lane {lane.key!r} to {peer}: {type(exc).__name__}: {exc}"
            ) from exc
        with self._lock:
            if session is not None and self._peers.lane(peer) == lane_index:
                still = self._local.memories.get(mem_id) is memory and (
                    remote is self._peers.memory(peer, remote_mem)
                )
                if still and not self._lanes.closed:
                    self._sessions[key] = session
            self._peers.connected(peer)
        return session

    def connection_lost(self, peer: PeerId, lane: int, reason: str) -> None:
        """An error completion left the QPs to ``peer`` in ERROR: rebuild on the next lane."""
        if not self._peers.next_lane(peer, lane):
            return  # already moved on
        self._drop(lambda k: k[0] == lane and k[2] == peer)
        _log.warning(
            "mori: connection broke; the next transfer uses a new one",
            peer=peer,
            lane=lane,
            reason=reason,
        )

    def forget_peer(self, peer: PeerId) -> None:
        """Forget ``peer``, what was imported from it and its sessions; its lane is kept."""
        self._peers.forget(peer)
        self._drop(lambda k: k[2] == peer)
        self._lanes.forget_peer(peer)

    def drop_lane(self, lane: int) -> None:
        """Forget every session of ``lane`` (its engine is being destroyed)."""
        self._drop(lambda k: k[0] == lane)

    def forget_local_memory(self, mem_id: int) -> None:
        self._drop(lambda k: k[1] == mem_id)

    def forget_remote_memory(self, peer: PeerId, mem_id: int) -> None:
        self._drop(lambda k: k[2] == peer and k[3] == mem_id)

    def clear(self) -> None:
        self._sessions.clear()

    def _drop(self, doomed: Callable[[SessionKey], bool]) -> None:
        for key in [k for k in self._sessions if doomed(k)]:
            del self._sessions[key]
