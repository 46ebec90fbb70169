"""Peers of the mori adapter: their engine descriptors, the lane each is on, imported regions.

A peer's lane outlives its removal: a peer that comes back never meets the queue pairs mori
kept for it on an earlier lane (see :mod:`moriio.adapters.mori.lanes`).

mori unpacks descriptors leniently (msgpack-c fills missing fields with defaults and ignores
extra ones: ``b"\x90"`` is an engine with an empty key, and the 1.2.5 nightly's extra
``backendDescs`` field is accepted), so what it unpacked is checked here for a usable key,
address and region before mori dials anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moriio.adapters.mori.settings import check_advertised_host
from moriio.adapters.mori.views import decode_view
from moriio.ports import PeerId, RemoteRegion

_RETRY_FIRST, _RETRY_MAX = 0.5, 30.0  # back-off after a failed connection attempt (s)


@dataclass(slots=True)
class Peer:
    """A peer's engine descriptor, and the back-off after a failed connection attempt."""

    desc: Any  # EngineDesc
    metadata: bytes
    retry_at: float = 0.0
    backoff: float = 0.0
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class Remote:
    """An imported region and where it lies among the peer's mori memories."""

    region: RemoteRegion
    desc: Any  # the peer's MemoryDesc of the memory the region lies in
    base: int  # byte offset of the region inside that memory


class PeerTable:
    """Known peers and what was imported from them; call with the adapter lock held."""

    def __init__(self) -> None:
        self._peers: dict[PeerId, Peer] = {}
        self._lanes: dict[PeerId, int] = {}  # lane per peer; survives forget
        self._imported: dict[tuple[PeerId, int], Remote] = {}
        self._memories: dict[tuple[PeerId, int], Any] = {}  # (peer, memory id) -> MemoryDesc

    def __contains__(self, peer: object) -> bool:
        return peer in self._peers

    def get(self, peer: PeerId) -> Peer | None:
        return self._peers.get(peer)

    def add(self, peer: PeerId, known: Peer) -> None:
        self._peers[peer] = known

    def forget(self, peer: PeerId) -> None:
        """Forget ``peer`` and everything imported from it (its lane is kept)."""
        self._peers.pop(peer, None)
        for key in [k for k in self._imported if k[0] == peer]:
            del self._imported[key]
        for mem_key in [k for k in self._memories if k[0] == peer]:
            del self._memories[mem_key]

    def lane(self, peer: PeerId) -> int:
        """The lane transfers to ``peer`` run on."""
        return self._lanes.get(peer, 0)

    def next_lane(self, peer: PeerId, lane: int) -> bool:
        """Move ``peer`` from ``lane`` to the next one; False if it already left ``lane``."""
        if self.lane(peer) != lane:
            return False
        self._lanes[peer] = lane + 1
        return True

    def on_lane(self, lane: int) -> list[PeerId]:
        """The known peers whose transfers run on ``lane``."""
        return [p for p in self._peers if self.lane(p) == lane]

    def refusal(self, peer: PeerId, now: float) -> str:
        """Why a post to ``peer`` fails without reaching mori; empty when it may go ahead."""
        known = self._peers[peer]
        if now < known.retry_at:
            return (
                f"no connection to {peer} ({known.last_error}); next attempt in "
                f"{known.retry_at - now:.1f} s"
            )
        return ""

    def connect_failed(self, peer: PeerId, reason: str, now: float) -> None:
        """Back off from ``peer``: posts are refused for a while, twice as long each time."""
        known = self._peers.get(peer)
        if known is not None:
            known.backoff = min(max(2 * known.backoff, _RETRY_FIRST), _RETRY_MAX)
            known.retry_at = now + known.backoff
            known.last_error = reason

    def connected(self, peer: PeerId) -> None:
        if (known := self._peers.get(peer)) is not None:
            known.backoff, known.retry_at = 0.0, 0.0

    def record_import(self, region: RemoteRegion, desc: Any, base: int) -> tuple[Remote, bool]:
        """Remember an imported region lying at ``base`` in the peer's memory ``desc``.

        True with it when that memory is new or changed: sessions to it are then stale.
        """
        mem_key = (region.peer, int(desc.id))
        known = self._memories.get(mem_key)
        changed = known is None or known != desc
        if changed:
            known = self._memories[mem_key] = desc
        remote = Remote(region, known, base)
        self._imported[(region.peer, region.region_id)] = remote
        return remote, changed

    def unimport(self, remote: Remote) -> None:
        """Undo :meth:`record_import` unless the region was imported again since."""
        key = (remote.region.peer, remote.region.region_id)
        if self._imported.get(key) is remote:
            del self._imported[key]

    def imported(self, region: RemoteRegion) -> Remote | None:
        """What is imported under ``region``'s peer and id, if anything."""
        return self._imported.get((region.peer, region.region_id))

    def memory(self, peer: PeerId, mem_id: int) -> Any | None:
        """The MemoryDesc of ``peer``'s memory ``mem_id``, if a region in it is imported."""
        return self._memories.get((peer, mem_id))

    def clear(self) -> None:
        self._peers.clear()
        self._imported.clear()
        self._memories.clear()


def check_engine_desc(desc: Any, rdma: bool) -> PeerId:
    """The peer id of an unpacked ``EngineDesc``; ValueError when mori could not use it."""
    key = str(desc.key)
    if not key:
        raise ValueError("malformed mori engine descriptor: empty engine key")
    if rdma:
        port, host = int(desc.port), str(desc.host)
        if not 1 < port <= 65535:  # 1 is mori's XGMI-only sentinel
            raise ValueError(f"mori engine descriptor of {key!r} has no dialable port ({port})")
        try:
            check_advertised_host(host)
        except ValueError as exc:
            raise ValueError(f"mori engine descriptor of {key!r}: {exc}") from None
    return PeerId(key)


def read_region_descriptor(
    io: Any, peer: PeerId, descriptor: bytes
) -> tuple[RemoteRegion, int, Any]:
    """(the region, its offset inside the remote memory, that memory's MemoryDesc)."""
    raw = bytes(descriptor)
    view = decode_view(raw)
    try:
        desc = io.MemoryDesc.unpack(raw if view is None else view.memory)
    except Exception as exc:  # the binding raises whatever msgpack raised
        raise ValueError(f"malformed mori memory descriptor: {exc}") from exc
    if not str(desc.engine_key) or int(desc.size) <= 0 or int(desc.loc) not in (1, 2):
        raise ValueError(
            f"mori memory descriptor names no usable memory (engine {str(desc.engine_key)!r}, "
            f"{int(desc.size)} bytes, location {int(desc.loc)})"
        )
    if view is None:
        return RemoteRegion(peer, int(desc.id), int(desc.size)), 0, desc
    if view.base + view.length > int(desc.size):
        raise ValueError(
            f"mori view {view.region_id} reaches past its memory ({view.base} + "
            f"{view.length} > {desc.size} bytes)"
        )
    return RemoteRegion(peer, view.region_id, view.length), view.base, desc
