"""How the mori adapter learns that a connection is gone, and what it does then.

mori 1.2.4 reports it three ways besides error completions: a post refused by a retired
endpoint (see :func:`~moriio.adapters.mori.status.lane_lost`), ``IOEngineSession.alive()``
False (a failure covering one of the session's queue pairs was observed), and
``IOEngine.pop_peer_failure()`` events (a peer unreachable, a local QP, port, CQ or device
failure; drained at every progress round). Each moves the peer to a new lane. A lane above 0
that no known peer uses any more, with no mori call running on it, is destroyed: its queue
pairs go, so nothing it posted can land any more (the only way to stop work when
``MORI_IO_QP_TIMEOUT=0`` disabled the retry timeout).
"""

from __future__ import annotations

from typing import Any

from moriio.adapters.mori.completions import Completions
from moriio.adapters.mori.connections import Connections
from moriio.adapters.mori.lanes import Lanes
from moriio.adapters.mori.peers import PeerTable
from moriio.ports import PeerId, TransferState, TransferStatus


def session_alive(session: Any) -> bool:
    """mori 1.2.4's ``IOEngineSession.alive()`` (True where mori lacks it)."""
    alive = getattr(session, "alive", None)
    return not callable(alive) or bool(alive())


def take_peer_failures(
    lanes: Lanes, peers: PeerTable, completions: Completions, connections: Connections
) -> None:
    """Fail the in-flight batches of every peer mori reported failed, and move those peers
    to a new lane (call with the adapter lock held)."""
    for lane, event in lanes.pop_failures():
        for peer, reason in peer_failure(event, lane, peers, lanes.peers_on(lane)):
            completions.fail_peer(peer, TransferStatus(TransferState.FAILED, reason), lane)
            connections.connection_lost(peer, lane, reason)


def retire_unused_lanes(
    lanes: Lanes,
    peers: PeerTable,
    completions: Completions,
    connections: Connections,
    busy: set[int],
    now: float,
) -> None:
    """Destroy every lane above 0 no known peer uses and not in ``busy``."""
    for lane in lanes.indices:
        if lane and lane not in busy and not peers.on_lane(lane):
            connections.drop_lane(lane)
            lanes.retire(lane)
            completions.retire_lane(lane, now)


def peer_failure(
    event: object, lane: int, peers: PeerTable, registered: list[PeerId]
) -> list[tuple[PeerId, str]]:
    """The peers on ``lane`` a ``PeerFailureEvent`` from that lane's engine covers, each with
    the reason to fail its transfers: the event's ``remote_engine_key``, or every peer the
    engine reaches when the key is empty (a port, CQ or device failure)."""
    key = str(getattr(event, "remote_engine_key", "") or "")
    reason = getattr(event, "reason", "UNKNOWN")
    name = str(getattr(reason, "name", reason))
    detail = str(getattr(event, "detail", "") or "")
    why = f"{name}: {detail}" if detail else name
    candidates = [PeerId(key)] if key else registered
    return [
        (
            peer,
            f"mori reports the connection to {peer} failed ({why}); transfers to it move to "
            "a new connection",
        )
        for peer in candidates
        if peer in peers and peers.lane(peer) == lane
    ]
